"""A consumer-group worker process for tests: ``group_worker.py CATALOG TOPIC GROUP MODE
WORK_SECONDS [MAX_EPOCHS [KEY]]``. Prints ``ready WORKER PID`` first, ``leased T DELIVERIES``
when it gets a lease (``leased T DELIVERIES BUCKET`` in key_shared mode), ``acked T``
once the ack was accepted (``acked T BUCKET CLOCK KEY,KEY,...`` in key_shared mode, with the
keys of the bucket's records and CLOCK the ``time.time()`` read just *before* ``ack()``: the
bucket's next epoch is leased only once this ack committed, so its CLOCK is later; a clock read
after ``ack()`` returned is not, for a worker descheduled between the two), ``refused T`` if
the ack was refused, ``done`` at the end (times as JSON). Each line goes out in one ``write``: with
``PYTHONUNBUFFERED=1`` (CI sets it) ``print`` writes every part on its own, and a worker killed
between two parts left a line cut after its first word (a CI failure).

A line is printed *after* what it reports took effect in the catalog, so a worker killed from
outside may hold leases it never printed (killed between a fetch and its ``leased`` lines) and
may have acked an epoch it never printed (killed between the ack and its line): its log alone
does not say what it held when it died — the catalog does (issue 26: a test that trusted the
log failed on a loaded machine).

``GROUP_WORKER_DIE=POINT:T`` makes the worker SIGKILL itself at one point of epoch ``T``'s
life, for tests that need to know exactly where it died:

- ``fetched``: the fetch returned a batch holding ``T``; none of its lines printed;
- ``leased``: right after the ``leased T`` line;
- ``acking``: inside ``ack()`` of ``T``, its update made but the catalog's COMMIT not begun;
- ``committed``: inside ``ack()`` of ``T``, right after the COMMIT, before ``ack()`` returned;
- ``acked``: ``ack()`` of ``T`` returned; ``acked T`` not printed."""

import json
import os
import signal
import sqlite3
import sys
import time

from epochstream import Catalog, EpochGroup, LeaseExpired

catalog, topic, name, mode, work = sys.argv[1:6]
max_epochs = int(sys.argv[6]) if len(sys.argv) > 6 else 1
key = sys.argv[7] if len(sys.argv) > 7 else None
die_point, _, die_time = os.environ.get("GROUP_WORKER_DIE", "").partition(":")
die_time = json.loads(die_time) if die_time else None
acking = None  # the epoch whose ack() is running


def die(point, t) -> None:
    if point == die_point and json.loads(json.dumps(t)) == die_time:
        os.kill(os.getpid(), signal.SIGKILL)


if die_point in ("acking", "committed"):
    class _Connection(sqlite3.Connection):
        """The catalog's connections: dies before or after the COMMIT of an ack."""

        def execute(self, sql, *args):
            if sql == "COMMIT" and acking is not None:
                die("acking", acking)
            out = super().execute(sql, *args)
            if sql == "COMMIT" and acking is not None:
                die("committed", acking)
            return out

    _connect = sqlite3.connect
    sqlite3.connect = lambda *a, **kw: _connect(*a, factory=_Connection, **kw)

group = EpochGroup(topic, name, Catalog(catalog), mode=mode, ack_wait=30.0, poll_interval=0.01,
                   **({"key": key, "buckets": 8} if key else {}))


def say(*parts) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


say("ready", group.worker, os.getpid())
while True:
    leases = group.fetch(max_epochs, expires=5.0)
    if not leases:
        break
    for lease in leases:
        die("fetched", lease.epoch.time)
    for lease in leases:
        t = json.dumps(lease.epoch.time)
        say("leased", t, lease.deliveries, *([lease.bucket] if key else []))
        die("leased", lease.epoch.time)
    for lease in leases:
        time.sleep(float(work))
        t = json.dumps(lease.epoch.time)
        acking, clock = lease.epoch.time, time.time()
        try:
            lease.ack()
        except LeaseExpired:
            say("refused", t)
            continue
        finally:
            acking = None
        die("acked", lease.epoch.time)
        if key:
            keys = ",".join(str(r[key]) for r in lease.epoch.records)
            say("acked", t, lease.bucket, repr(clock), keys)
        else:
            say("acked", t)
say("done")
