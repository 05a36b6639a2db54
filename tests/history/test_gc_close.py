"""A durable Subscriber dropped without close() and collected by the garbage collector while
this very thread is inside a catalog write: before, its ``__del__`` released the durable hold
synchronously and waited for the catalog's lock its own thread held — a deadlock (found when a
test hung in ``Catalog._write`` under ``Subscriber.__del__``). Now the catalog part of closing
runs in a thread of its own: no hang, and the hold is released right after the write."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc, sys, time
    from epochstream import Catalog, Publisher, Subscriber
    cat = Catalog(sys.argv[1])
    pub = Publisher("t", catalog=cat, heartbeat_interval=0.2)
    gc.disable()
    sub = Subscriber("t", cat, durable="d", timeout=5)
    sub.cycle = sub  # only the garbage collector can free it now
    del sub
    with cat._store.write():  # a catalog write of this thread, as a publisher's or an ack's
        gc.collect()    # ... during which the collector runs
    deadline = time.monotonic() + 5
    while cat.durable("t", "d").holder is not None:
        assert time.monotonic() < deadline, "the hold was never released"
        time.sleep(0.02)
    print("released", flush=True)
    pub.close(linger=0.2)
""")


def test_a_durable_subscriber_collected_inside_a_catalog_write_does_not_deadlock(tmp_path):
    try:
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "cat")],
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("deadlock: the process hung in Subscriber.__del__ under "
                             "Catalog._write") from None
    assert out.returncode == 0, out.stderr[-1500:]
    assert "released" in out.stdout
