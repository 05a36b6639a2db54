"""Deprecated alias of :mod:`epochstream.log` (the epoch log's writer and format), removed in the
next release: import from ``epochstream.log`` instead."""

from .log.format import RECORD_HEADER, partition_dir, read_epoch, segment_path
from .log.writer import LogWriter

__all__ = ["LogWriter", "read_epoch", "segment_path", "partition_dir", "RECORD_HEADER"]
