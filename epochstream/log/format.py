"""The epoch log's file format: where a partition's segments live and how an epoch is read
back from them, checked.

Segment file ``<dir>/<seq:010d>.eslog``: a sequence of records ::

    u32 length   -- bytes of the body (little-endian)
    u32 crc32    -- zlib.crc32 of kind + body
    u8  kind     -- b"D" (data) or b"F" (frontier update)
    body         -- D: u16 header length, the D time header (frame 1, msgpack), the payload
                 --    (frame 2, in the topic's codec, stored as received: no re-encoding)
                 -- F: the F header (frame 1, msgpack [[time, delta], ...])

Reading (:func:`read_epoch`): an epoch's records are read from its extents, each record's CRC
and the epoch's chained CRC checked; any mismatch, a short read or a missing file raises
:class:`~epochstream.errors.HistoryCorrupt` — corrupt bytes are never returned as data.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from urllib.parse import quote

from ..catalog.history import EpochRecord
from ..errors import HistoryCorrupt

__all__ = ["read_epoch", "check_epoch", "segment_path", "partition_dir", "RECORD_HEADER"]

RECORD_HEADER = struct.Struct("<IIc")
"""length (u32), crc32 (u32), kind (1 byte) of a record."""
_HLEN = struct.Struct("<H")
_U32 = struct.Struct("<I")
_D, _F = b"D", b"F"


def partition_dir(base: str | os.PathLike, topic: str, partition: int) -> Path:
    """``<base>/<topic, percent-encoded>/<partition>``: where a partition's segments live."""
    return Path(base) / quote(topic, safe="") / str(int(partition))


def segment_path(directory: str | os.PathLike, seq: int) -> Path:
    """The file of segment ``seq`` in ``directory``."""
    return Path(directory) / f"{seq:010d}.eslog"


def read_epoch(directory: str | os.PathLike, record: EpochRecord) -> list[tuple[bytes, bytes]]:
    """The ``(time header, payload)`` pairs of the epoch ``record`` describes, in the order
    they were sent, read from its segment in ``directory``. Checks every record's CRC-32, its
    kind, and the epoch's chained CRC-32 and message count against the index. Raises
    :class:`~epochstream.errors.HistoryCorrupt` (naming the file) for any mismatch, a short
    read or a missing segment."""
    path = segment_path(directory, record.segment)
    try:
        with open(path, "rb") as f:
            chunks = []
            for offset, length in record.extents:
                f.seek(offset)
                b = f.read(length)
                if len(b) != length:
                    raise HistoryCorrupt(f"segment {path}: epoch {record.time!r} is cut short "
                                         f"({len(b)} of {length} bytes at offset {offset})",
                                         path=str(path))
                chunks.append(b)
    except FileNotFoundError:
        raise HistoryCorrupt(f"segment {path} of epoch {record.time!r} is missing (deleted by "
                             f"retention while being read, or removed by hand)",
                             path=str(path)) from None
    return check_epoch(f"segment {path}", str(path), record, chunks)


def check_epoch(where: str, path: str, record: EpochRecord,
                chunks: list[bytes]) -> list[tuple[bytes, bytes]]:
    """The ``(time header, payload)`` pairs in ``chunks`` (the bytes of ``record``'s extents,
    read from a segment file or an object: ``where`` names it in messages, ``path`` in the
    error's ``path``), after checking every record's CRC-32 and kind, and the epoch's chained
    CRC-32 and message count against the index. Raises
    :class:`~epochstream.errors.HistoryCorrupt` for any mismatch."""
    crc = 0
    out = []
    hsize = RECORD_HEADER.size
    for (start, _), b in zip(record.extents, chunks):
        mv = memoryview(b)
        pos = 0
        while pos < len(b):
            if pos + hsize > len(b):
                raise HistoryCorrupt(f"{where}: epoch {record.time!r} has a cut record",
                                     path=path)
            length, rcrc, kind = RECORD_HEADER.unpack_from(b, pos)
            body = mv[pos + hsize:pos + hsize + length]
            if kind != _D or len(body) != length or zlib.crc32(body, zlib.crc32(kind)) != rcrc:
                raise HistoryCorrupt(f"{where}: a record of epoch {record.time!r} at "
                                     f"offset {start + pos} fails its checksum", path=path)
            crc = zlib.crc32(_U32.pack(rcrc), crc)
            (hl,) = _HLEN.unpack_from(body, 0)
            out.append((bytes(body[2:2 + hl]), bytes(body[2 + hl:])))
            pos += hsize + length
    if crc != record.crc or len(out) != record.messages:
        raise HistoryCorrupt(f"{where}: epoch {record.time!r} does not match its index "
                             f"entry (checksum or message count)", path=path)
    return out
