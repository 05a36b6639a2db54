"""A history fill reads the epoch index a page at a time (``transport/fill_pages.py``): the
catalog's pages (``history_epochs(after=, limit=)``) skip and repeat no row whatever times share
a first component; a join from ``earliest`` over many pages, with live epochs arriving as it
reads, gets every epoch whole, once, in an order consistent with the partial order; and the
first epoch costs one page of the index, not all of it."""

from __future__ import annotations

import threading
import time

import pytest

import epochstream.transport.fill_pages as fill_pages
from epochstream import Catalog, CatalogError, Publisher, Retention, Subscriber, product
from epochstream.catalog.history import EpochRecord
from epochstream.catalog.server import CatalogServer


@pytest.fixture
def tiny_pages(monkeypatch):
    monkeypatch.setattr(fill_pages, "PAGE_ROWS", 3)
    return 3


# -- the catalog's pages -------------------------------------------------------------------

@pytest.fixture(params=["direct", "remote"])
def index_catalog(request, catalog_location, tmp_path):
    """SQLite and PostgreSQL, each directly and through a catalog server."""
    if request.param == "direct":
        yield Catalog(catalog_location)
        return
    with CatalogServer(catalog_location, "tcp://127.0.0.1:*") as srv:
        remote = Catalog(srv.endpoint)
        yield remote
        remote.close()


def _times():
    """product(2) times, many per first component: (g, 0..11) for g in 0..3, plus
    negative components; stored text order ("[0, 10]" < "[0, 9]") is not numeric."""
    return [(g, j) for g in range(4) for j in range(12)] + [(-1, 5), (2, -3), (-1, -7)]


def test_pages_of_the_index_repeat_and_skip_no_row(index_catalog, tmp_path):
    cat = index_catalog
    cat.create_topic("idx", partitions=1, order="product(2)")
    cat.history_begin("idx", 0, str(tmp_path / "log"), [(-10, -10)], [(-10, -10)])
    times = _times()
    cat.history_commit("idx", 0, epochs=[EpochRecord(0, t, 0, ((i * 10, 10),), 10, 1, i,
                                                     time.time()) for i, t in enumerate(times)],
                       lower=[(9, 9)], upper=[(9, 9)], segment=0, committed=len(times) * 10)
    whole = [r.time for r in cat.history_epochs("idx", 0)]
    assert sorted(whole) == sorted(times)
    for limit in (1, 2, 3, 5, 12, 13, 100):
        for min_t0 in (None, 0, 2):
            got, after = [], None
            for _ in range(200):
                page = cat.history_epochs("idx", 0, min_t0=min_t0, after=after, limit=limit)
                assert len(page) <= limit
                got += [r.time for r in page]
                if len(page) < limit:
                    break
                after = page[-1].time
            expect = [t for t in whole if min_t0 is None or t[0] >= min_t0]
            assert got == expect, (limit, min_t0)
    for bad in ({"limit": 0}, {"limit": True}, {"limit": "3"}, {"after": "x"}, {"after": ()},
                {"after": (1, "x")}, {"after": {"a": 1}}, {"after": 1.5}):
        with pytest.raises(CatalogError):
            cat.history_epochs("idx", 0, **bad)


# -- joins over many pages -----------------------------------------------------------------

def _collect(sub, out, until, timeout=20.0):
    deadline = time.monotonic() + timeout
    for e in sub.epochs(timeout=timeout):
        out.append(e)
        if len(out) >= until or time.monotonic() > deadline:
            return


def _records_of(p: int, t: int) -> list:
    return [[p, t, k] for k in range(3)] if p == 0 or t % 3 == 0 else []


def test_join_from_earliest_over_many_pages_while_live_epochs_arrive(tmp_path, catalog_location,
                                                                     tiny_pages):
    """Two partitions (the second with data in every third epoch only: their pages cover
    different times), 40 epochs logged before the join and epoch 40 half sent when it joins
    (the fill's second batch owes it, and nothing of the first), 40 more sent while the fill
    reads its pages of 3 rows: every epoch 0..79 once, in order, with both partitions'
    records."""
    cat = Catalog(catalog_location)
    kw = dict(catalog=cat, partitions=2, retention=Retention(dir=str(tmp_path / "log")))
    pubs = [Publisher("many", i, **kw) for i in range(2)]

    def send(t: int, advance: bool = True) -> None:
        for p in pubs:
            if _records_of(p.partition, t):
                p.send(t, _records_of(p.partition, t))
            if advance:
                p.advance_to(t + 1)
    try:
        for t in range(40):
            send(t)
        for p in pubs:
            p.send(40, [[p.partition, 40, "first half"]])
        assert all(p.flush() for p in pubs)
        out: list = []
        sub = Subscriber("many", cat, start="earliest", timeout=20)
        assert sub.wait_ready(10)
        th = threading.Thread(target=_collect, args=(sub, out, 80))
        th.start()
        send(40)
        for t in range(41, 80):
            send(t)
            if t % 8 == 0:
                time.sleep(0.01)
        th.join(30)
        sub.close()
    finally:
        for p in pubs:
            p.close()
    assert [e.time for e in out] == list(range(80))
    for e in out:
        expect = [tuple(r) for p in range(2) for r in _records_of(p, e.time)]
        if e.time == 40:
            expect += [(p, 40, "first half") for p in range(2)]
        assert sorted(map(tuple, e.records), key=repr) == sorted(expect, key=repr)
    assert sub.stats["history_epochs"] >= 41


def _product_group(pubs, g: int, groups: int, per: int, js=None, last: bool = True) -> None:
    """Epochs (g, j) for j in ``js`` (default: all ``per``), each complete in turn (a
    capability at (g + 1, 0) held, minted at j == 0), then (``last``) the group's last
    capability released."""
    js = range(per) if js is None else js
    for j in js:
        for p in pubs:
            if j == 0 and g + 1 < groups:
                p.progress([((g + 1, 0), 1)])
            p.send((g, j), [[p.partition, g, j]])
            p.progress([((g, j), -1), ((g, j + 1), 1)])
    if last:
        for p in pubs:
            p.progress([((g, per), -1)])


def _assert_linear(order, times):
    for i, a in enumerate(times):
        for b in times[i + 1:]:
            assert not order.lt(b, a), (a, b)


def test_product_times_sharing_a_first_component_across_page_boundaries(tmp_path,
                                                                        catalog_location,
                                                                        tiny_pages):
    """product(2), two partitions: groups of 12 epochs (g, 0..11) share a first component,
    so pages of 3 rows cut every group, and the stored text orders (g, 10) before (g, 2).
    Three groups and a half logged, the join from earliest with (3, 5) half sent (a second
    batch owes it, and none of (3, 0..4) the first one owes: the first component does not
    separate them), the rest sent while it reads: every epoch once, whole, and no epoch after
    one it is <=."""
    order = product(2)
    cat = Catalog(catalog_location)
    kw = dict(order=order, catalog=cat, partitions=2,
              retention=Retention(dir=str(tmp_path / "log")))
    pubs = [Publisher("grid", i, **kw) for i in range(2)]
    groups, per = 6, 12
    try:
        for g in range(3):
            _product_group(pubs, g, groups, per)
        _product_group(pubs, 3, groups, per, range(5), last=False)
        for p in pubs:  # (3, 5) half sent at the join: the second batch owes only it
            p.send((3, 5), [[p.partition, 3, 5]])
        assert all(p.flush() for p in pubs)
        out: list = []
        sub = Subscriber("grid", cat, start="earliest", timeout=20)
        assert sub.wait_ready(10)
        th = threading.Thread(target=_collect, args=(sub, out, groups * per))
        th.start()
        for p in pubs:  # its second half, then it completes
            p.send((3, 5), [[p.partition, 3, 5]])
            p.progress([((3, 5), -1), ((3, 6), 1)])
        _product_group(pubs, 3, groups, per, range(6, per))
        for g in range(4, groups):
            _product_group(pubs, g, groups, per)
        th.join(30)
        sub.close()
    finally:
        for p in pubs:
            p.close()
    times = [e.time for e in out]
    assert sorted(times) == [(g, j) for g in range(groups) for j in range(per)]
    assert len(set(times)) == len(times)
    _assert_linear(order, times)
    for e in out:
        assert sorted(map(tuple, e.records)) == sorted(
            [(p, *e.time) for p in range(2)] * (2 if e.time == (3, 5) else 1))


def test_a_join_in_the_middle_of_a_product_group(tmp_path, catalog_location, tiny_pages):
    """The position (1, 5): history owes (1, 5..11) and the later groups' epochs at or beyond
    it (not (2, 0..4)), read over pages that cut the groups."""
    order = product(2)
    cat = Catalog(catalog_location)
    kw = dict(order=order, catalog=cat, partitions=1,
              retention=Retention(dir=str(tmp_path / "log")))
    pub = Publisher("mid", 0, **kw)
    try:
        for g in range(4):
            _product_group([pub], g, 4, 12)
        assert pub.flush()
    finally:
        pub.close()
    with Subscriber("mid", cat, start=[(1, 5)], timeout=10) as sub:
        times = [e.time for e in sub.epochs(timeout=10)]
    assert sorted(times) == [(g, j) for g in range(1, 4) for j in range(5, 12)]
    _assert_linear(order, times)


def test_the_first_epoch_reads_one_page_of_the_index_not_all_of_it(tmp_path, catalog_location,
                                                                   monkeypatch):
    """A log of 200 epochs, pages of 10 rows: when the first epoch from earliest (and from the
    middle) is handed out, at most one page of the index was read (before paging: all of it);
    the rest is read as the subscriber goes on, each row once."""
    monkeypatch.setattr(fill_pages, "PAGE_ROWS", 10)
    cat = Catalog(catalog_location)
    with Publisher("long", catalog=cat, retention=Retention(dir=str(tmp_path / "log"))) as pub:
        for t in range(200):
            pub.send(t, [[t]])
            pub.advance_to(t + 1)
    rows: list = []
    real = type(cat).history_epochs

    def counted(self, *args, **kw):
        page = real(self, *args, **kw)
        rows.append(len(page))
        return page
    monkeypatch.setattr(type(cat), "history_epochs", counted)
    for start, first in (("earliest", 0), (100, 100)):
        rows.clear()
        with Subscriber("long", cat, start=start, timeout=10) as sub:
            it = sub.epochs(timeout=10)
            assert next(it).time == first
            assert sum(rows) <= 10, rows
            rest = [e.time for e in it]
        assert rest == list(range(first + 1, 200))
        assert sum(rows) == 200 - first, rows  # each row read once


def test_retention_between_two_pages_of_a_fill_is_an_explicit_error_not_a_skip(
        tmp_path, catalog_location, monkeypatch):
    """Pages of 5 rows over a log of 60 epochs in several segments: after the first epoch
    from earliest is handed out, retention trims the index up to a segment holding epochs the
    fill has not read yet (the files stay: only the next page can tell). Reading on gives the
    epochs before the trimmed ones, without a gap, then HistoryUnavailable — never the epochs
    after the trimmed ones as if those had not existed."""
    from epochstream import HistoryUnavailable
    monkeypatch.setattr(fill_pages, "PAGE_ROWS", 5)
    cat = Catalog(catalog_location)
    retention = Retention(dir=str(tmp_path / "log"), segment_bytes=4096)
    with Publisher("trim", catalog=cat, retention=retention) as pub:
        for t in range(60):
            pub.send(t, [[t, "x" * 300]])
            pub.advance_to(t + 1)
    state = cat.history_state("trim", 0)
    assert len(state.segments) >= 4, state.segments
    keep_from = state.segments[len(state.segments) // 2].seq
    got: list = []
    with Subscriber("trim", cat, start="earliest", timeout=10) as sub:
        it = sub.epochs(timeout=10)
        got.append(next(it).time)
        since, _ = cat.history_trim("trim", 0, keep_from)
        assert since[0] > 5, since  # the trim took epochs the first page did not hold
        with pytest.raises(HistoryUnavailable):
            for e in it:
                got.append(e.time)
    assert got == list(range(len(got))) and len(got) < since[0], (got, since)
