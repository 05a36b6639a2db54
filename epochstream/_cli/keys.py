"""``epochstream keys generate DIR NAME``: a CURVE key pair in ZeroMQ's certificate format,
written by pyzmq's ``zmq.auth.create_certificates`` (docs/security.md).

``DIR/NAME.key`` holds the public key (give it to the other side: a publisher's to its
subscribers, a subscriber's to the publisher's ``allow`` directory), ``DIR/NAME.key_secret``
both keys (keep it private; it is created readable by its owner only, mode 0600). The public key is
printed in Z85 on stdout (for ``epochstream grant add``). An existing pair is never
overwritten (status 1). ``DIR`` defaults to ``$EPOCHSTREAM_KEYS``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from ..security import ENV_KEYS, load_keypair
from .errors import exit_on_errors
from .output import EXIT_USAGE, err, escape, fail, out
from .params import new_app

__all__ = ["app", "generate"]

app = new_app(
    "keys",
    help="CURVE key pairs (ZeroMQ certificates) for Publisher(security=...) and "
         "Subscriber(security=...): docs/security.md.",
    short_help="CURVE key pairs: keys generate DIR NAME.")


def generate(directory: Path, name: str) -> str:
    """Write ``directory/name.key`` and ``directory/name.key_secret`` (creating ``directory``);
    return the public key (Z85). Raises ``FileExistsError`` if either file exists, ``ValueError``
    for a name that is not a plain file name."""
    import zmq.auth

    if not name or name in (".", "..") or "/" in name or os.sep in name or name.startswith("."):
        raise ValueError(f"NAME must be a plain file name (no '/', not hidden), got {name!r}")
    directory.mkdir(parents=True, exist_ok=True)
    for suffix in (".key", ".key_secret"):
        if (directory / f"{name}{suffix}").exists():
            raise FileExistsError(f"{directory / (name + suffix)} exists already; "
                                  f"delete it first or choose another NAME")
    old = os.umask(0o077)  # the secret file must not be readable by others
    try:
        public_file, secret_file = zmq.auth.create_certificates(directory, name)
    finally:
        os.umask(old)
    os.chmod(public_file, 0o644 & ~old)  # the public half may be read by anyone
    public, _ = load_keypair(Path(secret_file), "generated key pair")
    return public


@app.command(
    "generate", short_help="Write a new key pair DIR/NAME.key and DIR/NAME.key_secret.",
    help="Write a new CURVE key pair with pyzmq's zmq.auth.create_certificates: DIR/NAME.key "
         "(the public key: hand it to the other side, e.g. into a publisher's allow "
         "directory) and DIR/NAME.key_secret (both keys: keep it private, mode 0600). Prints "
         "the public key in Z85 on stdout (the principal for 'epochstream grant add'). Never "
         "overwrites an existing pair. Exit status 0 on success, 1 if a file exists or cannot "
         "be written, 2 for bad usage.")
def generate_command(
    directory: Optional[Path] = typer.Argument(
        None, metavar="DIR", help="Directory of the key files (created if missing; default: "
                                  "$EPOCHSTREAM_KEYS)."),
    name: Optional[str] = typer.Argument(None, metavar="NAME",
                                         help="Base name of the two files."),
) -> None:
    if name is None and directory is not None and os.environ.get(ENV_KEYS):
        directory, name = Path(os.environ[ENV_KEYS]), str(directory)  # "keys generate NAME"
    if directory is None or name is None:
        raise fail(f"give DIR and NAME (or set ${ENV_KEYS} and give NAME)", EXIT_USAGE)
    with exit_on_errors(usage=(ValueError,), others=(OSError,)):
        public = generate(directory.expanduser(), name)
    out().print(escape(public), soft_wrap=True)
    err().print(f"wrote {escape(str(directory / (name + '.key')))} (public) and "
                f"{escape(str(directory / (name + '.key_secret')))} (secret)", soft_wrap=True)
