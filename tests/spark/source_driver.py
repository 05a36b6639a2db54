"""A Spark driver program for tests/spark/test_source.py (run as a subprocess, in a process group
of its own, so that a test can SIGKILL the driver with its JVM and Python workers): it reads a
topic with the ``epochstream`` source and writes Parquet with a checkpoint (Spark's file sink,
exactly-once through its ``_spark_metadata`` log), ``Trigger.AvailableNow``.

argv: topic catalog out checkpoint max_epochs hold_epoch hold_file. With ``hold_epoch >= 0``
the task that gets a batch holding that epoch writes ``hold_file`` (its pid) after yielding its
rows to the Parquet writer, then sleeps until it is killed. Prints ``batches [ids]`` at the end.
"""

from __future__ import annotations

import sys


def main() -> int:
    topic, catalog, out, checkpoint, max_epochs, hold_epoch, hold_file = sys.argv[1:8]
    from epochstream.spark import local_session, register

    spark = local_session("epochstream-source-driver", master="local[2]")
    register(spark)
    df = (spark.readStream.format("epochstream").option("topic", topic)
          .option("catalog", catalog).option("startingPosition", "earliest")
          .option("maxEpochsPerTrigger", max_epochs).option("durableName", "kill-test").load())
    hold = int(hold_epoch)

    def held(batches):  # defined here: shipped to the workers by value
        import os
        import time

        for b in batches:
            yield b
            if hold >= 0 and hold in b.column("_epoch").to_pylist():
                with open(hold_file, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(600)  # until the driver's process group is killed

    q = (df.mapInArrow(held, df.schema).writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    print("started", flush=True)
    q.awaitTermination()
    if q.exception() is not None:
        print("query failed:", q.exception(), flush=True)
        return 1
    print("batches", [p["batchId"] for p in q.recentProgress], flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
