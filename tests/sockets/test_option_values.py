"""Settings as values (issue 22, "values instead of sprawl"): ``record_filter=Filter(...)``,
``credit=Credit(...)`` and ``durable=Durable(...)`` behave exactly as their keyword forms, the
keyword forms keep working, and mixing the two forms of one setting is refused (nothing is
half-applied: no socket, no durable subscription left behind)."""

import pytest

from epochstream import Catalog, Retention
from epochstream.errors import SubscriptionHeld
from epochstream.filters import Filter, FilterError
from epochstream.options import Credit, Durable
from epochstream.transport import Publisher, Subscriber


def _send(pub, times):
    for t in times:
        pub.send(t, [{"carrier": c, "n": t} for c in ("AA", "UA")])
    pub.advance_to(max(times) + 1)
    pub.flush()


def _epochs(sub, n):
    it = sub.epochs(timeout=5)
    return [(e.time, sorted(r["carrier"] for r in e.records)) for e in
            (next(it) for _ in range(n))]


def test_credit_and_durable_values_validate_like_the_keywords():
    assert Credit(1, unit="epochs").count == 1
    for bad in (1, 0, True, 2.0, "3"):
        with pytest.raises(ValueError, match="credit must be an int >= 2"):
            Credit(bad)
    with pytest.raises(ValueError, match="credit_unit"):
        Credit(5, unit="bytes")
    with pytest.raises(TypeError, match="takeover"):
        Durable("d", takeover="false")  # a truthy string must not take a live holder's name
    assert Credit.of(None) is None and Credit.of(4, "epochs") == Credit(4, "epochs")
    with pytest.raises(ValueError, match="not also as credit_unit"):
        Credit.of(Credit(4), "epochs")
    with pytest.raises(ValueError, match="not also as takeover"):
        Durable.of(Durable("d"), True)


def test_a_filter_value_is_the_keyword_filter():
    with Publisher("t", key="carrier") as pub:
        subs = [Subscriber("t", endpoints=[pub.endpoint], keys={"AA"}, columns=["carrier"]),
                Subscriber("t", endpoints=[pub.endpoint],
                           record_filter=Filter(keys={"AA"}, columns=["carrier"]))]
        try:
            for s in subs:
                assert s.wait_ready(5)
            _send(pub, [0, 1])
            got = [_epochs(s, 2) for s in subs]
            assert got[0] == got[1] == [(0, ["AA"]), (1, ["AA"])]
            assert subs[1].record_filter == Filter(keys={"AA"}, columns=["carrier"])
        finally:
            for s in subs:
                s.close()


def test_both_forms_of_the_filter_are_refused_before_anything_is_opened():
    with Publisher("t") as pub:
        with pytest.raises(ValueError, match="not both"):
            Subscriber("t", endpoints=[pub.endpoint], keys={"AA"},
                       record_filter=Filter(keys={"UA"}))
        with pytest.raises(TypeError, match="record_filter must be a Filter"):
            Subscriber("t", endpoints=[pub.endpoint], record_filter={"keys": ["AA"]})
        with pytest.raises(FilterError):
            Subscriber("t", endpoints=[pub.endpoint], record_filter=None, keys="AA")
        assert pub.subscribers == 0


def test_a_credit_value_is_the_keyword_credit():
    with Publisher("t") as pub, \
            Subscriber("t", endpoints=[pub.endpoint], credit=Credit(2, unit="epochs")) as sub:
        assert (sub.credit, sub.credit_unit) == (2, "epochs")
        assert sub.wait_ready(5)
        _send(pub, range(6))
        assert [t for t, _ in _epochs(sub, 6)] == list(range(6))


def test_a_durable_value_is_the_keyword_durable_and_takes_over(tmp_path):
    cat = Catalog(tmp_path)
    with Publisher("t", catalog=cat, retention=Retention()) as pub:
        _send(pub, [0, 1, 2])
        first = Subscriber("t", cat, durable=Durable("d"), start="earliest")
        try:
            assert first.durable == "d"
            (t0, _), (t1, _) = _epochs(first, 2)
            first.ack(t0)  # 1 is handed out, not acked
            with pytest.raises(SubscriptionHeld):
                Subscriber("t", cat, durable="d")
            second = Subscriber("t", cat, durable=Durable("d", takeover=True))
            try:
                assert second.position == (1,)
                assert [t for t, _ in _epochs(second, 2)] == [1, 2]
                with pytest.raises(SubscriptionHeld):
                    first.ack(t1)  # fenced: the name was taken over
            finally:
                second.close()
        finally:
            first.close()
