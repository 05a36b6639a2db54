"""``python -m epochstream``: the ``epochstream`` command line (see :mod:`epochstream.cli`)."""

from .cli import main

if __name__ == "__main__":  # pragma: no cover - run as a module
    main()
