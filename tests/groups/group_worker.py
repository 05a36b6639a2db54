"""A consumer-group worker process for tests: ``group_worker.py CATALOG TOPIC GROUP MODE
WORK_SECONDS [MAX_EPOCHS [KEY]]``. Prints ``leased T DELIVERIES`` when it gets a lease
(``leased T DELIVERIES BUCKET`` in key_shared mode), ``acked T``
once the ack was accepted (``acked T BUCKET CLOCK KEY,KEY,...`` in key_shared mode, with
``time.time()`` of the ack and the keys of the bucket's records), ``refused T`` if the ack was
refused, ``done`` at the end (times as JSON). Each line goes out in one ``write``: with
``PYTHONUNBUFFERED=1`` (CI sets it) ``print`` writes every part on its own, and a worker killed
between two parts left a line cut after its first word (a CI failure)."""

import json
import sys
import time

from epochstream import Catalog, EpochGroup, LeaseExpired

catalog, topic, name, mode, work = sys.argv[1:6]
max_epochs = int(sys.argv[6]) if len(sys.argv) > 6 else 1
key = sys.argv[7] if len(sys.argv) > 7 else None
group = EpochGroup(topic, name, Catalog(catalog), mode=mode, ack_wait=30.0, poll_interval=0.01,
                   **({"key": key, "buckets": 8} if key else {}))


def say(*parts) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


say("ready")
while True:
    leases = group.fetch(max_epochs, expires=5.0)
    if not leases:
        break
    for lease in leases:
        t = json.dumps(lease.epoch.time)
        say("leased", t, lease.deliveries, *([lease.bucket] if key else []))
    for lease in leases:
        time.sleep(float(work))
        t = json.dumps(lease.epoch.time)
        try:
            lease.ack()
        except LeaseExpired:
            say("refused", t)
            continue
        if key:
            keys = ",".join(str(r[key]) for r in lease.epoch.records)
            say("acked", t, lease.bucket, repr(time.time()), keys)
        else:
            say("acked", t)
say("done")
