"""Where a topic's log lives, seen from outside (issue 23): ``epochstream topics`` and the
metrics collector show, per topic or partition with an object store, its bytes there and its
upload backlog (sealed segments not in the store yet) — the numbers ``epochstream history``
prints per partition."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import CollectorRegistry

from epochstream import Catalog, Publisher, Retention
from epochstream.catalog.history_records import EpochRecord
from epochstream.metrics import CatalogCollector


def _publish(cat, topic, store, epochs=3):
    with Publisher(topic, catalog=cat, retention=Retention(store=store,
                                                           segment_bytes=4096)) as pub:
        for t in range(epochs):
            pub.send(t, [{"t": t, "i": 0, "pad": "x" * 5000}])
            pub.advance_to(t + 1)
    pub.join(30)


def test_topics_and_metrics_show_store_bytes_and_upload_backlog(tmp_path):
    cat = Catalog(tmp_path / "cat")
    store = f"file://{tmp_path / 'shared'}"
    _publish(cat, "stored", store)
    with Publisher("plain", catalog=cat, retention=Retention()) as pub:
        pub.send(0, [1])
        pub.advance_to(1)
    state = cat.history_state("stored", 0)
    in_store = sum(g.object_bytes or 0 for g in state.segments if g.object)
    assert in_store > 3 * 5000
    # a sealed segment the store does not have yet (as the index sees it): the backlog
    cat.create_topic("waiting")
    cat.history_begin("waiting", 0, str(tmp_path / "w"), [0], [], store=store)
    cat.history_commit("waiting", 0, epochs=[EpochRecord(0, 0, 0, ((0, 10),), 10, 1, 0, 1.0)],
                       lower=[1], upper=[1], segment=0, committed=30, roll_to=1)
    p = subprocess.run([sys.executable, "-m", "epochstream", "topics", "--catalog",
                        str(tmp_path / "cat")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stdout.splitlines()
             if x.startswith(("stored:", "plain:", "waiting:"))]
    assert len(lines) == 2, p.stdout
    assert lines[0].startswith(f"stored: store {store}: ") and "in 3 object(s)" in lines[0]
    assert lines[0].endswith("upload backlog 0 sealed segment(s)"), lines[0]
    assert lines[1] == f"waiting: store {store}: 0 B in 0 object(s); upload backlog 1 " \
                       f"sealed segment(s)", lines[1]

    registry = CollectorRegistry()
    registry.register(CatalogCollector(cat))
    values = {(m.name, s.labels["topic"], s.labels["partition"]): s.value
              for m in registry.collect() for s in m.samples
              if m.name.startswith(("epochstream_partition_store",
                                    "epochstream_partition_upload"))}
    assert values == {("epochstream_partition_store_bytes", "stored", "0"): in_store,
                      ("epochstream_partition_upload_backlog_segments", "stored", "0"): 0,
                      ("epochstream_partition_store_bytes", "waiting", "0"): 0,
                      ("epochstream_partition_upload_backlog_segments", "waiting", "0"): 1}
