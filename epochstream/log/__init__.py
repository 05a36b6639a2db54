"""The epoch log: a partition's data and frontier messages as sent, in append-only segment
files indexed in the catalog, and read back whole, one epoch at a time (docs/history.md).

One word for one concept: the *log* is the storage (this package); *history* is what a reader
sees of it (:class:`History`: a topic's retained complete epochs); *retention* is the policy of
what the log keeps (:mod:`epochstream.retention`, pure, below the catalog).

- :mod:`.format` — the segment files' record format, :func:`read_epoch` (checksums);
- :mod:`.writer` — :class:`LogWriter`: append, group commit, roll, retention, recovery;
- :mod:`.reader` — :class:`History`: a topic's retained epochs, from the files or through the
  partition's live publisher;
- :mod:`.remote` — :class:`RemoteLog`: reading through a live publisher (its server side is
  :mod:`epochstream.transport.log_server`).
"""

from .format import RECORD_HEADER, partition_dir, read_epoch, segment_path
from .reader import History
from .remote import DEFAULT_TIMEOUT, RemoteLog
from .writer import LogWriter

__all__ = ["History", "LogWriter", "RemoteLog", "read_epoch", "segment_path", "partition_dir",
           "RECORD_HEADER", "DEFAULT_TIMEOUT"]
