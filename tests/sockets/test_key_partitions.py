"""Key-partitioned topics (epochstream/partitioning.py, docs/filters.md): partitions assigned
by the hash of the key, recorded in the catalog; each partition's publisher refuses a record of
another partition; a subscriber with ``keys`` joins only the partitions that can hold them and
still gets every epoch whole under its filter. Real publishers and sockets on 127.0.0.1."""

from __future__ import annotations

import pytest

from epochstream import Catalog, Publisher, Subscriber
from epochstream.errors import CatalogError, FilterError
from epochstream.partitioning import (PartitioningError, check_records, partition_of,
                                      partitions_for, split)

KEYS = ["AA", "UA", "DL", "B6", "WN", "AS", "NK", "F9"]
N = 4


def _records(t: int) -> list:
    return [{"carrier": k, "t": t, "i": i} for i, k in enumerate(KEYS * 2)]


def test_partition_of_is_stable_and_spreads():
    # the documented function: crc32 of the msgpack bytes (other clients can compute it)
    import zlib

    import msgpack
    for k in ["AA", b"AA", 1, 1.0, True, None, -5, "é"]:
        assert partition_of(k, 7) == zlib.crc32(msgpack.packb(k, use_bin_type=True)) % 7
    assert len({partition_of(f"k{i}", N) for i in range(100)}) == N
    assert partitions_for([], N) == set()


def test_split_and_check():
    recs = _records(0)
    parts = split(recs, "carrier", N)
    assert sorted(r["i"] for rs in parts.values() for r in rs) == list(range(len(recs)))
    for p, rs in parts.items():
        check_records(rs, "carrier", p, N)
        assert all(partition_of(r["carrier"], N) == p for r in rs)
    wrong = next(p for p in range(N) if p != partition_of("AA", N))
    with pytest.raises(PartitioningError, match="belongs to partition"):
        check_records([{"carrier": "AA"}], "carrier", wrong, N)
    with pytest.raises(PartitioningError, match="without the key"):
        check_records([{"x": 1}], "carrier", 0, N)
    import pyarrow as pa
    table = pa.Table.from_pylist(recs)
    tparts = split(table, "carrier", N)
    assert {p: t.to_pylist() for p, t in tparts.items()} == parts


def _publishers(cat):
    return [Publisher("kp", catalog=cat, partition=p, partitions=N, key="carrier",
                      partitioning="hash", heartbeat_interval=0.2) for p in range(N)]


def test_a_subscriber_with_keys_joins_only_their_partitions_and_gets_whole_epochs(tmp_path):
    cat = Catalog(tmp_path / "cat")
    pubs = _publishers(cat)
    info = cat.lookup("kp")
    assert info.partition_key == "carrier"
    want = {"AA", "DL"}
    joined = partitions_for(want, N)
    assert 0 < len(joined) < N  # the test needs some partitions skipped
    sub = Subscriber("kp", cat, keys=want, timeout=10)
    every = Subscriber("kp", cat, timeout=10)
    try:
        assert sub.wait_ready(5) and every.wait_ready(5)
        for p, pub in enumerate(pubs):
            assert pub.subscribers == (2 if p in joined else 1)  # skipped partitions: never
        for t in range(5):
            for p, recs in split(_records(t), "carrier", N).items():
                pubs[p].send(t, recs)
            for pub in pubs:
                pub.advance_to(t + 1)
        # a record of another partition is refused, nothing sent
        wrong = next(p for p in range(N) if p != partition_of("AA", N))
        with pytest.raises(PartitioningError):
            pubs[wrong].send(5, [{"carrier": "AA", "t": 5, "i": 0}])
        for pub in pubs:
            pub.close()
        got = [(e.time, sorted(r["i"] for r in e.records)) for e in sub.epochs(timeout=10)]
        assert got == [(t, [i for i, r in enumerate(_records(t)) if r["carrier"] in want])
                       for t in range(5)]
        assert [e.time for e in every.epochs(timeout=10)] == list(range(5))
        other = next(k for k in KEYS if partition_of(k, N) not in joined)
        with pytest.raises(FilterError, match="partitioned by key"):
            sub.update_filter(keys=want | {other})
    finally:
        sub.close()
        every.close()
        for pub in pubs:
            pub.close()


def test_partitioning_needs_a_key_column_and_is_part_of_the_topic(tmp_path):
    cat = Catalog(tmp_path / "cat")
    with pytest.raises(ValueError, match="key column"):
        Publisher("kp", catalog=cat, partitions=2, partitioning="hash")
    with pytest.raises(ValueError, match="partitioning"):
        Publisher("kp", catalog=cat, partitions=2, key="carrier", partitioning="range")
    pub = Publisher("kp", catalog=cat, partition=0, partitions=2, key="carrier",
                    partitioning="hash")
    try:
        with pytest.raises(CatalogError, match="different definition"):
            Publisher("kp", catalog=cat, partition=1, partitions=2, key="carrier")
    finally:
        pub.close()
