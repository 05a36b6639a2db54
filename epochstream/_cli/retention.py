"""``epochstream retention run``: retention by a lease holder for a topic with no running
publisher (docs/history.md, "Retention by a lease holder") as a typer sub-app: takes the
retention lease of every partition of the topic (refused, status 1, while a live publisher or
another runner holds one), applies the topic's limits — those its publishers recorded in the
catalog, each replaced by an option given — to the index, then to the store, once or every
``--interval`` seconds, and releases the leases at the end."""

from __future__ import annotations

from typing import Any, Optional

import typer

from .catalogs import open_existing_catalog
from .errors import exit_on_errors, interruptible
from .output import EXIT_ERROR, EXIT_USAGE, err, escape, fail, until_signal
from .params import CatalogToChange, Topic, new_app

__all__ = ["app", "limits_for"]

RETENTION_STATUS_HELP = (
    "Exit status:\n\n\b\n"
    "  0    done (--interval: stopped by SIGINT or SIGTERM)\n"
    "  1    refused: a live publisher or another runner holds a partition's\n"
    "       retention lease (or it was lost); a store that could not be cleaned\n"
    "  2    bad usage; no catalog at the path; unknown topic; no limits; a topic\n"
    "       that keeps no epoch log\n"
)

app = new_app(
    "retention",
    help="Apply a topic's retention limits to its epoch logs' index and object store when no "
         "publisher of the topic runs (a running publisher applies them itself).",
    short_help="Apply retention for a topic with no running publisher.",
    epilog=RETENTION_STATUS_HELP)


def limits_for(recorded: Optional[dict[str, Any]], **given: Any) -> dict[str, Any]:
    """The limits to apply: the ``recorded`` ones (``Catalog.retention_limits``), each replaced
    by a ``given`` one that is not ``None``. Raises ``ValueError`` if there are none."""
    limits: dict[str, Any] = dict.fromkeys(("max_bytes", "max_age", "max_epochs"))  # (None: no limit)
    limits.update(recorded or {})
    limits.update({k: v for k, v in given.items() if v is not None})
    if not any(limits.get(k) is not None for k in ("max_bytes", "max_age", "max_epochs")):
        raise ValueError("no retention limits recorded for the topic (its publishers keep no "
                         "log yet, or none with limits); pass --max-age, --max-bytes or "
                         "--max-epochs")
    return limits


def _report(runs: list[Any], topic: str) -> bool:
    """Print what one run did (stdout: one line per partition that changed; stderr: the store
    errors); True if a store could not be cleaned."""
    from .output import out

    failed = False
    for r in runs:
        if r.segments or r.orphans:
            out().print(escape(
                f"{topic} partition {r.partition}: {r.segments} segment(s) deleted from the "
                f"index, {r.objects} object(s) and {r.orphans} left-over object(s) from the "
                f"store; retained since {list(r.since)}"
                + (f"; expired: {', '.join(r.expired)}" if r.expired else "")), soft_wrap=True)
        if r.error:
            failed = True
            err().print(escape(f"warning: {topic} partition {r.partition}: {r.error}"),
                        soft_wrap=True)
    return failed


@app.command(
    "run", short_help="Apply a topic's retention limits while holding its retention lease.",
    help="Take the retention lease of every partition of TOPIC (refused while a live publisher "
         "or another runner holds one: nothing is deleted), then apply the topic's retention "
         "limits: the oldest whole segments beyond them are deleted from the catalog's index "
         "first, then their objects from the store, and objects a runner killed mid-deletion "
         "left behind too. The limits are those the topic's publishers recorded "
         "(Retention(max_bytes=, max_age=, max_epochs=)); an option given replaces one for "
         "this run. Local segment files stay: they are their publisher's.",
    epilog=RETENTION_STATUS_HELP)
def retention_run(
    topic: Topic,
    catalog: CatalogToChange = None,
    once: bool = typer.Option(False, "--once", help="Apply the limits once, then exit "
                                                    "(the default)."),
    interval: Optional[float] = typer.Option(
        None, "--interval", metavar="S", help="Apply the limits every S seconds until "
                                              "SIGINT/SIGTERM, holding the leases."),
    max_age: Optional[float] = typer.Option(None, "--max-age", metavar="S",
                                            help="Delete epochs completed over S seconds ago."),
    max_bytes: Optional[int] = typer.Option(None, "--max-bytes", metavar="N",
                                            help="Keep at most N bytes per partition."),
    max_epochs: Optional[int] = typer.Option(None, "--max-epochs", metavar="N",
                                             help="Keep at most N epochs per partition."),
    lease: float = typer.Option(30.0, "--lease", metavar="S",
                                help="Seconds the leases hold without a renewal."),
) -> None:
    if once and interval is not None:
        raise fail("--once and --interval exclude each other", EXIT_USAGE)
    if interval is not None and not (interval > 0):
        raise fail(f"--interval must be seconds > 0, got {interval:g}", EXIT_USAGE)
    if not 0 < lease < 1e6:
        raise fail(f"--lease must be seconds > 0, got {lease:g}", EXIT_USAGE)
    cat = open_existing_catalog(catalog)
    from ..log.retainer import Retainer  # the log package: not for --help
    from ..retention import Retention

    with exit_on_errors(cat, usage=(ValueError,)):
        cat.lookup(topic)
        limits = limits_for(cat.retention_limits(topic), max_age=max_age,
                            max_bytes=max_bytes, max_epochs=max_epochs)
        retainer = Retainer(cat, topic, Retention(**limits), lease=lease)
        if not retainer.acquire():
            raise fail(f"topic {topic!r} keeps no epoch log: nothing to apply retention to",
                       EXIT_USAGE)
    try:
        with exit_on_errors(cat), interruptible(), until_signal() as stop:
            failed = _serve(retainer, topic, interval, lease, stop)
    finally:
        retainer.release()
    if failed and interval is None:
        raise typer.Exit(EXIT_ERROR)


def _serve(retainer: Any, topic: str, interval: Optional[float], lease: float,
           stop: Any) -> bool:
    """One run, then (``interval``) one every ``interval`` seconds until ``stop`` is set,
    renewing the leases every third of ``lease`` in between; True if the last run could not
    clean a store."""
    import time

    failed = _report(retainer.run_once(), topic)
    next_run = time.monotonic() + (interval or 0.0)
    while interval is not None and not stop.is_set():
        if stop.wait(max(0.0, min(next_run - time.monotonic(), lease / 3))):
            break
        retainer.renew()
        if time.monotonic() >= next_run:
            failed = _report(retainer.run_once(), topic)
            next_run = time.monotonic() + interval
    return failed
