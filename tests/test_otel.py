"""OpenTelemetry metrics (epochstream/otel.py) against a known truth, collected by the real SDK
(an InMemoryMetricReader on an injected MeterProvider: nothing global is touched): a total-order
topic at epoch 10, a durable subscription acked to 4, a consumer group, a product-order topic
(whose frontiers are not single numbers: no epoch gauge, the lag gauges still)."""

from epochstream import Catalog, EpochGroup, Publisher, Retention, Subscriber
from epochstream.order import product


def _collect(reader):
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out[(m.name, tuple(sorted(p.attributes.items())))] = p.value
    return out


def test_instruments_report_the_known_truth(tmp_path):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from epochstream.otel import INSTRUMENTS, instrument

    cat = Catalog(tmp_path)
    with Publisher("t", catalog=cat, retention=Retention()) as pub, \
            Publisher("p", catalog=cat, order=product(2)) as pp:
        for e in range(10):
            pub.send(e, [[e]])
            pub.advance_to(e + 1)
        pub.flush()
        pp.send((0, 0), [[0]])
        pp.advance_to((1, 0))
        pp.flush()
        with Subscriber("t", cat, durable="d", start="earliest") as sub:
            it = sub.epochs(timeout=5)
            for _ in range(4):
                sub.ack(next(it))
            EpochGroup("t", "g", cat)  # created, nothing fetched: 10 epochs behind
            reader = InMemoryMetricReader()
            provider = MeterProvider(metric_readers=[reader])
            handle = instrument(cat, provider)
            got = _collect(reader)
            provider.shutdown()
    part = (("partition", 0), ("topic", "t"))
    assert got[("epochstream.partition.lower_epoch", part)] == 10
    assert got[("epochstream.partition.upper_epoch", part)] == 9
    assert got[("epochstream.partition.live", part)] == 1
    assert ("epochstream.partition.lower_epoch", (("partition", 0), ("topic", "p"))) not in got
    assert got[("epochstream.partition.live", (("partition", 0), ("topic", "p")))] == 1
    d = (("name", "d"), ("topic", "t"))
    assert got[("epochstream.durable.lag_epochs", d)] == 6
    assert got[("epochstream.durable.lag", d)] >= 0
    g = (("group", "g"), ("topic", "t"))
    assert got[("epochstream.group.lag_epochs", g)] == 10
    assert got[("epochstream.group.redelivered", g)] == 0
    assert {name for name, _ in got} == set(INSTRUMENTS)
    assert handle.errors == 0
