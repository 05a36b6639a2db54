"""epochstream.aio, issue 26: a cancelled ``anext()`` does not end an async iterator.

``aio.Subscriber.epochs()`` and ``events()`` return iterators that survive a cancelled
``__anext__``: the next ``anext()`` on the SAME iterator goes on with the stream, nothing lost,
nothing twice; only the stream's end raises ``StopAsyncIteration``. Each test streams from a
real publisher on 127.0.0.1 (a threaded one, in a worker thread, so that it runs truly
alongside the event loop; flow-controlled by the subscriber's credit) while ONE iterator is
pulled with random cancellations, the way users write them: ``asyncio.wait_for``,
``asyncio.timeout()``, a ``TaskGroup`` whose other task fails, ``task.cancel()``. The
publisher goes on until the consumer has been cancelled at least :data:`CANCELS` times, then
closes: the iterator must then have handed out every epoch once, whole, in order, and end.
A fixed seed per test (the patterns and delays replay; the timing of the sockets does not).
Each test fails on the async-generator iterators this replaced: their first cancelled
``anext()`` ended them."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import threading
import time

import pytest

from epochstream import Catalog, Publisher, aio
from epochstream.events import DataMessage, LowerFrontierUpdate

CANCELS = 60  # the publisher goes on until the consumer was cancelled this many times
MESSAGES = 3  # messages per epoch
# seconds before a pending anext() is cancelled: 0 (wait_for: before it started; the others:
# at its first suspension), tiny ones that land inside a pull, and ones that let most finish
DELAYS = [0, 0.00005, 0.0001, 0.0003, 0.0005, 0.001, 0.002, 0.005, 0.05]
PATTERNS = ["wait_for", "timeout", "taskgroup", "task_cancel"]
# the streaming publisher's options: a backlog bound that, with the subscriber's credit (8),
# holds the producer back to the consumer's pace (flow control, never an eviction)
HELD_BACK = {"heartbeat_interval": 0.2, "max_queue_messages": 64}


def _records(t: int, m: int, n: int = 4) -> list:
    return [{"t": t, "m": m, "i": i} for i in range(n)]


def _whole(t, records, n: int = 4) -> None:
    assert sorted((r["m"], r["i"]) for r in records) == \
        [(m, i) for m in range(MESSAGES) for i in range(n)], t
    assert {r["t"] for r in records} == {t}


def _produce(pub, enough: threading.Event, seed: int, start: int = 0,
             min_epochs: int = 100) -> int:
    """In a worker thread: epochs ``start, start+1, ...`` of :data:`MESSAGES` messages each,
    with short random pauses, until at least ``min_epochs`` were sent and ``enough`` is set
    (20 s at most); then close. Returns the number of the epoch after the last one sent."""
    rng = random.Random(seed)
    t, give_up = start, time.monotonic() + 20
    while t < start + min_epochs or (not enough.is_set() and time.monotonic() < give_up):
        for m in range(MESSAGES):
            pub.send(t, _records(t, m))
        pub.advance_to(t + 1)
        t += 1
        if rng.random() < 0.3:
            time.sleep(rng.choice([0.0002, 0.001, 0.003]))
    pub.close()
    return t


_CANCELLED = object()


class _Boom(Exception):
    """The failing sibling of the TaskGroup pattern."""


async def _pull(pattern: str, it, delay: float):
    """One ``anext(it)`` cancelled after ``delay`` seconds if still pending, as users write
    it: the item, or ``_CANCELLED``. ``StopAsyncIteration`` passes through."""
    if pattern == "wait_for":
        try:
            return await asyncio.wait_for(anext(it), delay)
        except TimeoutError:
            return _CANCELLED
    if pattern == "timeout":
        try:
            async with asyncio.timeout(delay):
                return await anext(it)
        except TimeoutError:
            return _CANCELLED
    assert pattern == "task_cancel"

    async def one():
        return await anext(it)

    task = asyncio.create_task(one())
    if delay:
        await asyncio.wait({task}, timeout=delay)
    task.cancel()  # delay 0: cancelled before it started
    try:
        return await task
    except asyncio.CancelledError:
        return _CANCELLED


async def _drain(it, rng: random.Random, patterns: list, enough: threading.Event,
                 work: float = 0.0) -> tuple:
    """Pull ``it`` to its end with random cancellations (``patterns`` chosen at random per
    pull); set ``enough`` once cancelled :data:`CANCELS` times. ``work``: seconds of
    processing per item that never await (as a consumer that computes): the subscriber then
    lets other tasks run — a cancellation point — every ``aio.YIELD_EVERY_S``, also inside a
    burst or a history fill. Returns (items, cancelled)."""
    items: list = []
    cancelled = 0

    def take(x):
        items.append(x)
        if work:
            time.sleep(work)
    while True:
        if cancelled >= CANCELS:
            enough.set()
        pattern, delay = rng.choice(patterns), rng.choice(DELAYS)
        if pattern == "taskgroup":  # a consumer task, and a sibling that fails
            ended = False

            async def consume():
                nonlocal ended
                async for x in it:
                    take(x)
                ended = True

            async def sibling():
                await asyncio.sleep(delay)
                if not ended:
                    raise _Boom()

            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(consume())
                    tg.create_task(sibling())
            except* _Boom:
                cancelled += 1
            if ended:
                return items, cancelled
            continue
        try:
            x = await _pull(pattern, it, delay)
        except StopAsyncIteration:
            return items, cancelled
        if x is _CANCELLED:
            cancelled += 1
        else:
            take(x)


def _watch(sub) -> collections.Counter:
    """Count the cancellations that land inside a pull, at each of the aio subscriber's
    suspension points (``_readable``: waiting for data; ``_breathe``: letting other tasks
    run): a test that only ever cancelled pulls before they started would prove little."""
    where: collections.Counter = collections.Counter()
    for name in ("_readable", "_breathe"):
        inner = getattr(sub, name)

        async def watched(*args, _inner=inner, _name=name):
            try:
                return await _inner(*args)
            except asyncio.CancelledError:
                where[_name] += 1
                raise

        setattr(sub, name, watched)
    return where


async def _stream_and_drain(sub, pub, pull: str, patterns: list, seed: int,
                            start: int = 0, work: float = 0.0) -> tuple:
    """Run the producer thread and drain ``sub.<pull>()`` with random cancellations; the
    subscriber is closed at the end (before the producer is awaited: a consumer that stopped
    early must not leave the producer held back by credit). Returns (items, cancelled, sent,
    iterator)."""
    rng = random.Random(seed)
    enough = threading.Event()
    producer = asyncio.create_task(asyncio.to_thread(_produce, pub, enough, seed, start))
    where = _watch(sub)
    it = getattr(sub, pull)()
    try:
        items, cancelled = await asyncio.wait_for(_drain(it, rng, patterns, enough, work), 60)
        finished = sub.finished
    finally:
        enough.set()
        sub.close()
        sent = await producer
    assert finished, (f"the iterator ended before the stream did: {len(items)} items, "
                      f"{cancelled} cancelled pulls; the publisher sent {sent - start} epochs")
    assert cancelled >= CANCELS
    assert sum(where.values()) >= CANCELS // 3, where  # many landed inside a pull
    print(f"\n{pull}() {patterns}: {cancelled} cancelled pulls ({dict(where)} inside one), "
          f"{sent} epochs")
    return items, cancelled, sent, it, where


@pytest.mark.asyncio
@pytest.mark.parametrize("pattern", PATTERNS + ["mixed"])
async def test_one_epochs_iterator_survives_random_cancellations(tmp_path, pattern):
    """ONE ``sub.epochs()`` iterator, its ``anext()`` cancelled at random points (60+ times)
    while a real publisher streams under flow control: every epoch once, whole, in order;
    ``StopAsyncIteration`` only once the publisher closed, and on every later ``anext()``."""
    seed = PATTERNS.index(pattern) + 1 if pattern in PATTERNS else 7
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("c", catalog=cat, **HELD_BACK)
    sub = aio.Subscriber("c", cat, timeout=10, credit=8)
    assert await sub.wait_ready(5)
    items, cancelled, sent, it, where = await _stream_and_drain(
        sub, pub, "epochs", PATTERNS if pattern == "mixed" else [pattern], seed)
    assert [e.time for e in items] == list(range(sent)), \
        f"{len(items)} of {sent} epochs before the iterator ended ({cancelled} cancels)"
    for e in items:
        _whole(e.time, e.records)
    assert cancelled >= CANCELS
    with pytest.raises(StopAsyncIteration):
        await anext(it)  # ended for good
    print(f"\n{pattern}: {cancelled} cancelled pulls, {sent} epochs once, whole, in order")


def _rebuild(events: list) -> dict:
    """Epoch time -> records, from ``events()``'s data events; checks that no data event is
    behind the merged lower frontier it follows."""
    data: dict = {}
    lower: set = set()
    for ev in events:
        if isinstance(ev, DataMessage):
            assert not lower or min(lower) <= ev.time, ev.time  # never behind the frontier
            data.setdefault(ev.time, []).extend(ev.data)
        elif isinstance(ev, LowerFrontierUpdate):
            for t, d in ev.updates:
                (lower.add if d > 0 else lower.discard)(t)
    return data


@pytest.mark.asyncio
async def test_one_events_iterator_survives_random_cancellations(tmp_path):
    """ONE ``sub.events()`` iterator, cancelled at random points by every pattern: rebuilding
    epochs from its data and frontier events gives every epoch once, whole; it ends with the
    stream."""
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("e", catalog=cat, **HELD_BACK)
    sub = aio.Subscriber("e", cat, timeout=10, credit=8)
    assert await sub.wait_ready(5)
    items, cancelled, sent, it, where = await _stream_and_drain(sub, pub, "events", PATTERNS, 21)
    data = _rebuild(items)
    assert sorted(data) == list(range(sent)), f"{len(data)} of {sent} epochs ({cancelled})"
    for t, recs in data.items():
        _whole(t, recs)
    assert cancelled >= CANCELS
    with pytest.raises(StopAsyncIteration):
        await anext(it)


@pytest.mark.asyncio
@pytest.mark.parametrize("pull", ["epochs", "events"])
async def test_a_history_fill_then_live_under_random_cancellations(tmp_path, pull):
    """``start="earliest"`` over 400 retained epochs (3 messages of 100 records), then the
    live stream: ONE iterator, cancelled at random points — also while the fill is handed
    out, where it lets the event loop run — hands out the retained and the live epochs once,
    whole, in order."""
    from epochstream import Retention

    retained, n = 600, 100
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("h", catalog=cat, retention=Retention(dir=tmp_path / "logs"), **HELD_BACK)
    for t in range(retained):
        for m in range(MESSAGES):
            pub.send(t, _records(t, m, n))
        pub.advance_to(t + 1)
    assert pub.flush(10)
    sub = aio.Subscriber("h", cat, start="earliest", timeout=10, credit=8)
    assert await sub.wait_ready(5)
    items, cancelled, sent, it, where = await _stream_and_drain(sub, pub, pull, PATTERNS, 33,
                                                         start=retained, work=0.0003)
    if pull == "epochs":
        assert [e.time for e in items] == list(range(sent)), (len(items), sent, cancelled)
        got = {e.time: e.records for e in items}
        assert sub.stats["history_epochs"] >= 1
    else:
        got = _rebuild(items)
        assert sorted(got) == list(range(sent)), (len(got), sent, cancelled)
    for t, recs in got.items():
        _whole(t, recs, n if t < retained else 4)
    with pytest.raises(StopAsyncIteration):
        await anext(it)


@pytest.mark.asyncio
async def test_timeout_counts_the_waiting_of_cancelled_pulls_and_does_not_end_it(tmp_path):
    """``epochs(timeout=0.4)`` pulled with ``wait_for(..., 0.1)``: the cancelled waits add up,
    so the iterator's own ``TimeoutError`` comes after about 0.4 s of waiting (not never); the
    same iterator then goes on with the next epoch, and ends with the stream."""
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("t", catalog=cat, heartbeat_interval=0.2)
    try:
        async with aio.Subscriber("t", cat, timeout=10) as sub:
            assert await sub.wait_ready(5)
            it = sub.epochs(timeout=0.4)
            cancelled, t0 = 0, time.monotonic()
            while True:
                try:
                    await asyncio.wait_for(anext(it), 0.1)
                except TimeoutError as exc:
                    if "no epoch within" in str(exc):
                        break  # the iterator's own timeout
                    cancelled += 1
                assert time.monotonic() - t0 < 3, "the cancelled waits never added up"
            assert 2 <= cancelled <= 6, cancelled
            assert time.monotonic() - t0 >= 0.35
            pub.send(0, ["a"])
            pub.advance_to(1)
            pub.close()
            assert [e.records for e in [await anext(it)]] == [["a"]]
            with pytest.raises(StopAsyncIteration):
                await anext(it)
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_aclose_aclosing_break_and_fetch_lose_nothing(tmp_path):
    """``aclose()`` (and ``contextlib.aclosing``) ends an iterator; leaving one by ``break``
    or ``aclose`` holds nothing back: a new ``epochs()``, ``events()`` or ``fetch()`` goes on
    with the next epoch, in order."""
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("a", catalog=cat, heartbeat_interval=0.2)
    try:
        async with aio.Subscriber("a", cat, timeout=10) as sub:
            assert await sub.wait_ready(5)
            for t in range(40):  # all there before the first pull: one burst
                pub.send(t, [t])
                pub.advance_to(t + 1)
            pub.close()
            got = []
            async with contextlib.aclosing(sub.epochs()) as it:
                got.append((await anext(it)).time)
            with pytest.raises(StopAsyncIteration):
                await anext(it)  # closed
            async for e in sub.epochs():
                got.append(e.time)
                if e.time == 4:
                    break
            it = sub.epochs()
            got.append((await anext(it)).time)
            await it.aclose()
            r = await sub.fetch(max_epochs=3)
            got.extend(e.time for e in r.epochs)
            got.extend([e.time async for e in sub.epochs(timeout=5)])
            assert got == list(range(40))
    finally:
        pub.close()


@pytest.mark.asyncio
async def test_two_tasks_pulling_one_iterator_share_it(tmp_path):
    """Two tasks pulling the same iterator are served one ``anext()`` at a time: each epoch
    goes to one of them, each task sees its epochs in order, and both see the end."""
    cat = Catalog(tmp_path / "cat")
    pub = Publisher("s", catalog=cat, heartbeat_interval=0.2)
    try:
        async with aio.Subscriber("s", cat, timeout=10, credit=8) as sub:
            assert await sub.wait_ready(5)
            it = sub.epochs()

            async def take():
                return [e.time async for e in it]

            tasks = [asyncio.create_task(take()) for _ in range(2)]

            def produce():
                for t in range(100):
                    pub.send(t, [t])
                    pub.advance_to(t + 1)
                    if t % 10 == 0:
                        time.sleep(0.002)
                pub.close()

            await asyncio.to_thread(produce)
            a, b = await asyncio.wait_for(asyncio.gather(*tasks), 20)
            assert a == sorted(a) and b == sorted(b)
            assert sorted(a + b) == list(range(100))
    finally:
        pub.close()
