"""A cProfile of the subscriber receiving Arrow messages of 1000 records (38 KB), the `peers`
case's Arrow configuration: the publisher runs in its own process (``multiprocessing`` spawn),
sending as fast as credit allows; the subscriber here pulls ``events()`` and counts every row
(``num_rows`` of each decoded batch, ``DataMessage.data``), as the benchmark's subscriber does. Writes
``benchmarks/results/profile_subscriber_arrow.txt``: wall time and CPU of both processes, then
the subscriber's functions by internal and cumulative time.

``python -m benchmarks.profile_arrow [SECONDS]``"""

from __future__ import annotations

import cProfile
import io
import multiprocessing as mp
import os
import pstats
import sys
import time

from . import RESULTS
from .payloads import encoded


def _publisher(catalog, endpoint_q, stop, seconds):
    from epochstream import Catalog, Publisher
    pub = Publisher("arrow-prof", 0, catalog=Catalog(catalog), codec="arrow",
                    heartbeat_interval=0.5)
    endpoint_q.put(pub.endpoint)
    payloads = encoded("arrow", 1000)
    t0 = time.process_time()
    e, n = 0, 0
    deadline = time.monotonic() + seconds + 3
    while not stop.is_set() and time.monotonic() < deadline:
        for _ in range(10):
            pub.send_encoded(e, payloads[n % len(payloads)])
            n += 1
        e += 1
        pub.advance_to(e)
    endpoint_q.put((n, time.process_time() - t0))
    pub.close(linger=1)


def main(seconds: float = 4.0) -> str:
    import tempfile

    from epochstream import Catalog, Subscriber
    from epochstream.events import DataMessage

    catalog = tempfile.mkdtemp(prefix="profile-arrow-")
    ctx = mp.get_context("spawn")
    q, stop = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_publisher, args=(catalog, q, stop, seconds))
    p.start()
    q.get(timeout=30)
    sub = Subscriber("arrow-prof", Catalog(catalog), credit=64, timeout=10)
    assert sub.wait_ready(10)
    rows = 0
    prof = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.process_time()
    prof.enable()
    deadline = time.monotonic() + seconds
    for ev in sub.events(timeout=10):
        if isinstance(ev, DataMessage):
            rows += ev.data.num_rows
        if time.monotonic() >= deadline:
            break
    prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop.set()
    sub.close()  # (a subscriber that stops reading would hold the publisher back)
    sent, pub_cpu = q.get(timeout=30)
    p.join(30)
    out = io.StringIO()
    out.write(f"cProfile of the subscriber (events(), Arrow, 1000 records = 38 KB per message, "
              f"credit 64), publisher in its own process; {time.strftime('%Y-%m-%d %H:%M')}, "
              f"loadavg {os.getloadavg()[0]:.2f}\n")
    out.write(f"subscriber: {rows / wall / 1e6:.2f}M rows/s under the profiler ({rows / 1000 / wall:,.0f} "
              f"messages/s), wall {wall:.2f} s, CPU {cpu:.2f} s ({cpu / wall:.0%} of one core); "
              f"publisher: {sent} messages sent, CPU {pub_cpu:.2f} s over its whole run\n\n")
    for key, n in (("tottime", 20), ("cumulative", 20)):
        st = pstats.Stats(prof, stream=out)
        st.sort_stats(key).print_stats(n)
    path = RESULTS / "profile_subscriber_arrow.txt"
    path.write_text(out.getvalue().replace(os.getcwd() + "/", ""))
    return str(path)


if __name__ == "__main__":
    print(main(float(sys.argv[1]) if len(sys.argv) > 1 else 4.0))
