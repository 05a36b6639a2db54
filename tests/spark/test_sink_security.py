"""The sink into a secured host, through a real local SparkSession (docs/security.md): the
tasks and the driver-side commit connect over CURVE with the ``clientKey`` option and the key
the catalog records for the host; a key without a ``publish`` grant fails the query with the
host's "not authorised to publish" and stages nothing, a granted one publishes whole epochs
that a secured subscriber receives."""

from __future__ import annotations

import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zmq.auth

pytest.importorskip("pyspark")

from pyspark.errors import StreamingQueryException  # noqa: E402

from epochstream import Catalog, Security, Subscriber  # noqa: E402
from epochstream.spark import IngestError, SparkPublisherHost, start_query  # noqa: E402

TOPIC = "sec.flights"


@pytest.mark.spark
def test_only_a_granted_client_key_publishes_through_the_sink(quiet_spark, tmp_path):
    spark = quiet_spark
    keys, allow, data = tmp_path / "keys", tmp_path / "allow", tmp_path / "in"
    for d in (keys, allow, data):
        d.mkdir()
    for name in ("server", "writer", "stranger", "reader"):
        zmq.auth.create_certificates(keys, name)
        if name != "server":
            shutil.copy(keys / f"{name}.key", allow / f"{name}.key")
    for day in range(2):  # one file per micro-batch: epochs 0 and 1
        pq.write_table(pa.table({"day": [day] * 5, "x": list(range(5))}),
                       data / f"day{day}.parquet")
        os.utime(data / f"day{day}.parquet", (1e9 + day, 1e9 + day))  # the source's order
    cat = Catalog(tmp_path / "cat")
    cat.grant("writer", TOPIC, "publish")
    cat.grant("reader", TOPIC, "subscribe")
    sec = Security.curve(server_secret=keys / "server.key_secret", allow=allow)

    def query(name: str, key: str):
        df = (spark.readStream.schema("day bigint, x bigint").option("maxFilesPerTrigger", 1)
              .parquet(str(data)))
        q = start_query(spark, df, TOPIC, checkpoint=tmp_path / f"ck-{name}",
                        catalog=host.catalog_path, trigger={"availableNow": True},
                        options={"clientKey": str(keys / f"{key}.key_secret"),
                                 "ackTimeout": 10, "commitTimeout": 10})
        try:
            assert q.awaitTermination(120), "query did not finish"
        except StreamingQueryException as e:  # a failed query raises its exception here
            return e
        return q.exception()

    with SparkPublisherHost(TOPIC, partitions=1, catalog=cat, security=sec,
                            publisher_kwargs={"heartbeat_interval": 0.2}) as host:
        sub = Subscriber(TOPIC, catalog=cat, timeout=10.0, security=Security.curve(
            client_secret=keys / "reader.key_secret"))
        try:
            assert sub.wait_ready(10)
            # allowed in (its certificate is in allow/) but no publish grant: the task fails
            error = query("stranger", "stranger")
            assert error is not None and \
                f"not authorised to publish to topic '{TOPIC}'" in str(error), error
            assert host.next_epoch() == 0 and host.stats(0).staged_batches == 0
            assert host.stats(0).unauthorised >= 1

            assert query("writer", "writer") is None
            got = []
            for e in sub.epochs(timeout=10):
                got.append((e.time, sorted(e.records.column("day").to_pylist())))
                if len(got) == 2:
                    break
        finally:
            sub.close()
    assert got == [(0, [0] * 5), (1, [1] * 5)], "whole epochs, the granted writer's rows only"


@pytest.mark.spark
def test_tasks_read_a_secured_catalog_service_through_its_url(quiet_spark, tmp_path):
    """The whole path behind a secured network catalog (``catalog serve --key --allow``): the
    host registers through it with its own key (``publish`` grant), the query's tasks and the
    driver-side commit open it from the URL alone (``?client_key=PATH&server_key=PATH``, as an
    executor on another machine would) and publish whole epochs that a secured subscriber,
    itself reading the catalog through the service, receives. A query whose URL names a key the
    service does not answer fails to start with the catalog's error (and its hint), at once."""
    from epochstream.catalog.server import CatalogServer

    spark = quiet_spark
    keys, allow, data = tmp_path / "keys", tmp_path / "allow", tmp_path / "in"
    for d in (keys, allow, data):
        d.mkdir()
    for name in ("catalog", "server", "host", "writer", "reader", "stranger"):
        zmq.auth.create_certificates(keys, name)
        if name not in ("catalog", "server", "stranger"):
            shutil.copy(keys / f"{name}.key", allow / f"{name}.key")
    for day in range(2):
        pq.write_table(pa.table({"day": [day] * 5, "x": list(range(5))}),
                       data / f"day{day}.parquet")
        os.utime(data / f"day{day}.parquet", (1e9 + day, 1e9 + day))
    db = tmp_path / "cat"
    file_cat = Catalog(db)
    for name, op in (("host", "publish"), ("writer", "publish"), ("reader", "subscribe")):
        file_cat.grant(name, TOPIC, op)

    with CatalogServer(db, "tcp://127.0.0.1:*", security=Security.curve(
            server_secret=keys / "catalog.key_secret", allow=allow)) as service:
        def url(who: str) -> str:
            return (f"{service.endpoint}?client_key={keys / f'{who}.key_secret'}"
                    f"&server_key={keys / 'catalog.key'}&timeout=5")

        def query(name: str, who: str):
            df = (spark.readStream.schema("day bigint, x bigint")
                  .option("maxFilesPerTrigger", 1).parquet(str(data)))
            q = start_query(spark, df, TOPIC, checkpoint=tmp_path / f"ck-{name}",
                            catalog=url(who), trigger={"availableNow": True},
                            options={"clientKey": str(keys / "writer.key_secret"),
                                     "ackTimeout": 10, "commitTimeout": 10})
            try:
                assert q.awaitTermination(120), "query did not finish"
            except StreamingQueryException as e:
                return e
            return q.exception()

        host_cat = Catalog(url("host"))
        with SparkPublisherHost(TOPIC, partitions=1, catalog=host_cat, security=Security.curve(
                server_secret=keys / "server.key_secret", allow=allow),
                publisher_kwargs={"heartbeat_interval": 0.2}) as host:
            sub = Subscriber(TOPIC, catalog=Catalog(url("reader")), timeout=10.0,
                             security=Security.curve(client_secret=keys / "reader.key_secret"))
            try:
                assert sub.wait_ready(10)
                with pytest.raises(IngestError, match="cannot read catalog .*allow directory"):
                    query("stranger", "stranger")  # the service never answers this key
                assert host.next_epoch() == 0 and host.stats(0).staged_batches == 0
                assert query("writer", "writer") is None
                got = []
                for e in sub.epochs(timeout=10):
                    got.append((e.time, sorted(e.records.column("day").to_pylist())))
                    if len(got) == 2:
                        break
            finally:
                sub.close()
        host_cat.close()
    assert got == [(0, [0] * 5), (1, [1] * 5)]
