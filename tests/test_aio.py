"""epochstream.aio: the asyncio twins, with real publishers and sockets on 127.0.0.1 (and a
killed publisher process). Mirrors the threaded tests that matter: a join in the middle of an
epoch, several partitions, credit, recover, PublisherLost; plus cancellation at random points
under load (nothing lost, every epoch whole) and a send that waits for credit without blocking
the event loop. The coroutine tests run under pytest-asyncio (``@pytest.mark.asyncio``), each in
an event loop of its own."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import textwrap
import time

import pytest

from epochstream import Catalog, Publisher, aio
from epochstream.errors import PublisherLost
from epochstream.events import Gap


def _records(t: int, m: int, n: int = 4) -> list:
    return [{"t": t, "m": m, "i": i} for i in range(n)]


def _whole(epoch, messages: int, n: int = 4) -> None:
    assert sorted((r["m"], r["i"]) for r in epoch.records) == \
        [(m, i) for m in range(messages) for i in range(n)], epoch.time
    assert {r["t"] for r in epoch.records} == {epoch.time}


@pytest.mark.asyncio
async def test_join_mid_epoch_and_several_partitions(tmp_path):
    async def main():
        cat = Catalog(tmp_path / "cat")
        pubs = [Publisher("a", catalog=cat, partition=p, partitions=2, heartbeat_interval=0.2)
                for p in range(2)]
        for pub in pubs:
            pub.send(0, _records(0, pub.partition))  # epoch 0 begun before the join
        async with aio.Subscriber("a", cat, timeout=5) as sub:
            assert await sub.wait_ready(5)
            for pub in pubs:
                pub.send(0, _records(0, 9))
                pub.advance_to(1)
            for t in range(1, 6):
                for pub in pubs:
                    pub.send(t, _records(t, pub.partition))
                    pub.advance_to(t + 1)
            for pub in pubs:
                pub.close()
            got = [e async for e in sub.epochs(timeout=5)]
        assert [e.time for e in got] == [1, 2, 3, 4, 5]  # epoch 0 was joined mid-way: not at all
        for e in got:
            _whole(e, 2)

    await main()


@pytest.mark.asyncio
async def test_cancelled_pulls_at_random_points_lose_nothing(tmp_path):
    """A producer task publishes under flow control (credit) while the consumer's pulls are
    cancelled at random moments (``asyncio.wait_for`` with random tiny timeouts, and outright
    ``task.cancel()``): every epoch still arrives once, whole, in order."""
    rng = random.Random(11)
    epochs, messages = 200, 3
    stats = {"cancelled": 0, "pulls": 0}

    async def produce(pub):
        for t in range(epochs):
            for m in range(messages):
                await pub.send(t, _records(t, m))
            await pub.advance_to(t + 1)
            await asyncio.sleep(rng.choice([0, 0.001, 0.003]))  # the consumer often waits
        await pub.close()

    async def main():
        cat = Catalog(tmp_path / "cat")
        pub = aio.Publisher("c", catalog=cat, heartbeat_interval=0.2)
        sub = aio.Subscriber("c", cat, timeout=10, credit=8)
        assert await sub.wait_ready(5)
        producer = asyncio.create_task(produce(pub))
        got = []
        while True:
            stats["pulls"] += 1
            if rng.random() < 0.5:
                task = asyncio.create_task(sub.fetch(max_epochs=rng.randint(1, 5)))
                await asyncio.sleep(rng.choice([0, 0.0005, 0.001, 0.002]))
                if not task.done():
                    task.cancel()
                try:
                    r = await task
                except asyncio.CancelledError:
                    stats["cancelled"] += 1
                    continue
            else:
                try:
                    r = await asyncio.wait_for(sub.fetch(max_epochs=rng.randint(1, 5)),
                                               rng.choice([0.0005, 0.002, 0.01, 1.0]))
                except asyncio.TimeoutError:
                    stats["cancelled"] += 1
                    continue
            got.extend(r.epochs)
            if r.finished:
                break
        await producer
        sub.close()
        return got

    got = await main()
    assert [e.time for e in got] == list(range(epochs))
    for e in got:
        _whole(e, messages)
    assert stats["cancelled"] >= 20, stats  # the test did cancel, many times
    print(f"\n{stats['cancelled']} of {stats['pulls']} pulls cancelled; {len(got)} epochs whole")


@pytest.mark.asyncio
async def test_send_waits_for_credit_without_blocking_the_loop(tmp_path):
    """A subscriber that does not read holds the publisher back (credit): ``await send`` waits
    while another task of the same loop keeps running; reading releases it."""
    async def main():
        cat = Catalog(tmp_path / "cat")
        pub = aio.Publisher("w", catalog=cat, heartbeat_interval=0.2, queue_hwm=4,
                            max_queue_messages=8)
        sub = aio.Subscriber("w", cat, timeout=10, credit=2)
        assert await sub.wait_ready(5)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        tick = asyncio.create_task(ticker())
        sent = 0

        async def producer():
            nonlocal sent
            for t in range(60):
                await pub.send(t, _records(t, 0, 200))
                await pub.advance_to(t + 1)
                sent = t + 1
            await pub.close()

        prod = asyncio.create_task(producer())
        await asyncio.sleep(0.5)
        held, ticks_held = sent, ticks
        assert held < 60 and ticks_held > 20  # held back, and the loop kept running
        got = [e.time async for e in sub.epochs(timeout=10)]
        await prod
        tick.cancel()
        sub.close()
        assert got == list(range(60))

    await main()


PUB_PROC = textwrap.dedent("""
    import sys, time
    from epochstream import Catalog, Publisher
    pub = Publisher("k", catalog=Catalog(sys.argv[1]), heartbeat_interval=0.2)
    for t in range(3):
        pub.send(t, [t])
        pub.advance_to(t + 1)
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.mark.asyncio
async def test_a_killed_publisher_is_publisher_lost(tmp_path, recover=False):
    async def main():
        proc = subprocess.Popen([sys.executable, "-c", PUB_PROC, str(tmp_path / "cat")],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            sub = aio.Subscriber("k", Catalog(tmp_path / "cat"), timeout=1.0, ping_interval=0.2,
                                 recover=recover, start="latest")
            assert await sub.wait_ready(5)
            proc.kill()
            proc.wait(10)
            t0 = time.monotonic()
            with pytest.raises(PublisherLost):
                async for _ in sub.epochs(timeout=10):
                    pass
            assert time.monotonic() - t0 < 5
            sub.close()
        finally:
            proc.kill()
            proc.wait(10)

    await main()


@pytest.mark.asyncio
async def test_recover_reports_a_gap_then_whole_epochs(tmp_path):
    """An aborted publisher (epoch 1 half sent) and its successor: the pulling task sees epoch
    0, a Gap, then the successor's epochs whole — never the half epoch."""
    async def main():
        cat = Catalog(tmp_path / "cat")
        pub = Publisher("g", catalog=cat, heartbeat_interval=0.2)
        sub = aio.Subscriber("g", cat, timeout=10, recover=True, ping_interval=0.2)
        assert await sub.wait_ready(5)
        items: list = []

        async def consume():
            async for item in sub.epochs(timeout=15):
                items.append(item)
                if not isinstance(item, Gap) and item.time == 2:
                    return

        task = asyncio.create_task(consume())
        pub.send(0, [0])
        pub.advance_to(1)
        pub.send(1, ["half"])
        pub.abort("test")
        await asyncio.sleep(0.5)
        pub2 = Publisher("g", catalog=cat, heartbeat_interval=0.2, start=1)
        for _ in range(500):
            if any(isinstance(i, Gap) for i in items):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        pub2.send(1, ["whole-1"])
        pub2.send(2, ["whole-2"])
        pub2.advance_to(3)
        await asyncio.wait_for(task, 15)
        pub2.close()
        sub.close()
        return items

    items = await main()
    assert items[0].time == 0 and isinstance(items[1], Gap) and items[1].reason == "aborted"
    epochs = {i.time: list(i.records) for i in items if not isinstance(i, Gap)}
    assert epochs.get(1, ["whole-1"]) == ["whole-1"] and epochs[2] == ["whole-2"]


def test_the_readme_examples_run_as_written(tmp_path):
    """Every ``python`` block of the README's asyncio section prints the ``text`` block that
    follows it (the second: one epochs() iterator pulled with asyncio.wait_for, issue 26)."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "README.md").read_text()
    section = text.split("## asyncio", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(python|text)\n(.*?)```", section, re.S)
    assert [kind for kind, _ in blocks] == ["python", "text"] * (len(blocks) // 2)
    assert len(blocks) >= 4
    for (_, code), (_, expected) in zip(blocks[0::2], blocks[1::2]):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert out.stdout == expected


@pytest.mark.asyncio
async def test_events_cancelled_at_random_points_lose_nothing(tmp_path):
    """``events()`` pulled one event at a time with random tiny deadlines (each cancellation
    closes that generator; the next ``events()`` goes on): rebuilding epochs from the data
    events and the frontier changes gives every epoch once, whole."""
    from epochstream.events import DataMessage, LowerFrontierUpdate

    rng = random.Random(5)
    epochs, messages = 120, 3

    async def produce(pub):
        for t in range(epochs):
            for m in range(messages):
                await pub.send(t, _records(t, m))
            await pub.advance_to(t + 1)
            await asyncio.sleep(rng.choice([0, 0.001, 0.002]))
        await pub.close()

    async def main():
        cat = Catalog(tmp_path / "cat")
        pub = aio.Publisher("e", catalog=cat, heartbeat_interval=0.2)
        sub = aio.Subscriber("e", cat, timeout=10, credit=8)
        assert await sub.wait_ready(5)
        producer = asyncio.create_task(produce(pub))
        data: dict = {}
        lower: set = set()
        cancelled = 0
        while True:
            gen = sub.events()
            try:
                ev = await asyncio.wait_for(gen.__anext__(), rng.choice([0.0005, 0.002, 1.0]))
            except asyncio.TimeoutError:
                cancelled += 1
                continue
            except StopAsyncIteration:
                break
            finally:
                await gen.aclose()
            if isinstance(ev, DataMessage):
                assert not lower or min(lower) <= ev.time  # never behind the frontier
                data.setdefault(ev.time, []).extend(ev.data)
            elif isinstance(ev, LowerFrontierUpdate):
                for t, d in ev.updates:
                    (lower.add if d > 0 else lower.discard)(t)
        await producer
        sub.close()
        return data, cancelled

    data, cancelled = await main()
    assert sorted(data) == list(range(epochs))
    for t, recs in data.items():
        assert sorted((r["m"], r["i"]) for r in recs) == \
            [(m, i) for m in range(messages) for i in range(4)], t
    assert cancelled >= 20, cancelled
    print(f"\nevents(): {cancelled} pulls cancelled; {len(data)} epochs whole")


@pytest.mark.asyncio
async def test_durable_resume_and_history_under_asyncio(tmp_path):
    """The durable twin of tests/history: an aio subscriber joining at "earliest" reads the
    retained epochs whole, then the live ones; it acks some and closes; a second aio
    subscriber of the same durable name resumes exactly after the last ack (nothing acked
    again, nothing skipped), while the publisher goes on."""
    from epochstream import Retention

    async def main():
        cat = Catalog(tmp_path / "cat")
        pub = Publisher("d", catalog=cat, retention=Retention(dir=tmp_path / "logs"),
                        heartbeat_interval=0.2)
        try:
            for t in range(3):  # retained before anyone subscribes
                for m in range(3):
                    pub.send(t, _records(t, m))
                pub.advance_to(t + 1)
            assert pub.flush(5)
            async with aio.Subscriber("d", cat, durable="ops", start="earliest",
                                      timeout=5) as sub:
                got = []
                async for e in sub.epochs(timeout=5):
                    got.append(e)
                    _whole(e, 3)
                    if e.time <= 3:
                        await sub.ack(e)
                    if e.time == 2:  # history done: the live stream follows, gaplessly
                        for m in range(3):
                            pub.send(3, _records(3, m))
                        pub.advance_to(4)
                        for m in range(3):
                            pub.send(4, _records(4, m))
                        pub.advance_to(5)
                    if e.time == 4:
                        break  # 4 handed out, not acked
                assert [e.time for e in got] == [0, 1, 2, 3, 4]
                assert sub.stats["history_epochs"] >= 1
            for m in range(3):
                pub.send(5, _records(5, m))
            pub.advance_to(6)
            assert pub.flush(5)
            async with aio.Subscriber("d", cat, durable="ops", timeout=5) as again:
                assert again.position == (4,)
                got = []
                async for e in again.epochs(timeout=5):
                    got.append(e)
                    _whole(e, 3)
                    if e.time == 5:
                        break
                assert [e.time for e in got] == [4, 5]
        finally:
            pub.close()

    await main()


@pytest.mark.asyncio
async def test_a_secured_aio_subscriber_and_a_refused_one(tmp_path):
    """security= passes through: a granted key reads whole epochs; a key without a grant
    gets NotAuthorized from ``await wait_ready`` (and nothing of the stream)."""
    import zmq.auth

    from epochstream import NotAuthorized, Security

    keys = tmp_path / "keys"
    allow = tmp_path / "allow"
    keys.mkdir()
    allow.mkdir()
    for n in ("server", "alice", "bob"):
        zmq.auth.create_certificates(keys, n)
    for n in ("alice", "bob"):
        (allow / f"{n}.key").write_bytes((keys / f"{n}.key").read_bytes())

    async def main():
        cat = Catalog(tmp_path / "cat")
        cat.grant("alice", "s.*", "subscribe")
        pub = Publisher("s.t", catalog=cat, heartbeat_interval=0.2,
                        security=Security.curve(server_secret=keys / "server.key_secret",
                                                allow=allow))
        try:
            alice = Security.curve(client_secret=keys / "alice.key_secret")
            bob = Security.curve(client_secret=keys / "bob.key_secret")
            async with aio.Subscriber("s.t", cat, security=alice, timeout=5) as sub:
                assert await sub.wait_ready(5)
                refused = aio.Subscriber("s.t", cat, security=bob, timeout=5)
                with pytest.raises(NotAuthorized, match="not authorised"):
                    await refused.wait_ready(5)
                refused.close()
                for t in range(3):
                    for m in range(2):
                        pub.send(t, _records(t, m))
                    pub.advance_to(t + 1)
                pub.close()
                got = [e async for e in sub.epochs(timeout=5)]
            assert [e.time for e in got] == [0, 1, 2]
            for e in got:
                _whole(e, 2)
        finally:
            pub.close()

    await main()


def _retained_history(tmp_path, epochs: int, messages: int, n: int):
    """A live, idle publisher of topic "h" with ``epochs`` retained epochs of ``messages``
    messages of ``n`` tuples each; returns (catalog, publisher)."""
    from epochstream import Retention

    cat = Catalog(tmp_path / "cat")
    pub = Publisher("h", catalog=cat, retention=Retention(dir=tmp_path / "logs"),
                    heartbeat_interval=0.2)
    for t in range(epochs):
        for m in range(messages):
            pub.send(t, [(t, m, i) for i in range(n)])
        pub.advance_to(t + 1)
    assert pub.flush(10)
    return cat, pub


@pytest.mark.asyncio
@pytest.mark.parametrize("pull", ["events", "epochs"])
async def test_a_long_history_fill_lets_other_tasks_of_the_loop_run(tmp_path, pull):
    """Joining at "earliest" over a retained history (300 epochs x 4 messages x 300 tuples)
    whose consumer never awaits in its loop body: another task of the event loop still runs
    while the fill is handed out (before aio.YIELD_EVERY_S, handing out a fill never let go
    of the loop: 0 ticks from its first item to its last). Every epoch whole."""
    epochs, messages, n = 300, 4, 300
    cat, pub = _retained_history(tmp_path, epochs, messages, n)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        async with aio.Subscriber("h", cat, start="earliest", timeout=10) as sub:
            assert await sub.wait_ready(5)
            at_first = None
            got: dict = {}
            if pull == "events":
                from epochstream.events import DataMessage
                seen = 0  # records (the publisher may have coalesced an epoch's messages)
                async for ev in sub.events(timeout=10):
                    if isinstance(ev, DataMessage):
                        if at_first is None:
                            at_first = ticks
                        got.setdefault(ev.time, []).extend(ev.data)
                        seen += len(ev.data)
                        if seen == epochs * messages * n:
                            break
            else:
                async for ep in sub.epochs(timeout=10):
                    if at_first is None:
                        at_first = ticks
                    got[ep.time] = list(ep.records)
                    if len(got) == epochs:
                        break
            during = ticks - at_first
    finally:
        task.cancel()
        pub.close()
    assert sorted(got) == list(range(epochs))
    for t, recs in got.items():
        assert sorted(recs) == [(t, m, i) for m in range(messages) for i in range(n)], t
    assert during > 0, "the event loop ran no other task while the history fill was handed out"


@pytest.mark.asyncio
async def test_events_reads_a_history_fill_as_it_hands_it_out(tmp_path):
    """``events()`` over a retained history decodes it one message at a time: the memory
    allocated until its first data event is a small part of the fill's decoded size (before,
    the whole fill was read and decoded into the pending events at once)."""
    import tracemalloc

    from epochstream.events import DataMessage

    epochs, messages, n = 200, 4, 300
    cat, pub = _retained_history(tmp_path, epochs, messages, n)
    try:
        async with aio.Subscriber("h", cat, start="earliest", timeout=10) as sub:
            assert await sub.wait_ready(5)
            tracemalloc.start()
            try:
                gen = sub.events(timeout=10)
                first = await gen.__anext__()
                while not isinstance(first, DataMessage):
                    first = await gen.__anext__()
                _, peak_first = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
                held = [first]
                seen = len(first.data)
                async for ev in gen:  # hold every message: what the whole fill takes
                    if isinstance(ev, DataMessage):
                        held.append(ev)
                        seen += len(ev.data)
                        if seen == epochs * messages * n:
                            break
                whole, _ = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            await gen.aclose()
    finally:
        pub.close()
    assert sorted({ev.time for ev in held}) == list(range(epochs))
    assert peak_first < whole / 10, (peak_first, whole)
