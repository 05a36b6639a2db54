"""Adversarial INPUTS to the public surface of durable history (docs/history.md).

The rule attacked: bad input gets a clear error of a documented type and changes nothing —
no durable subscription is created, moved, claimed or released by a refused call, the logs and
a live publisher are untouched, and a well-formed subscriber next to the offender still gets
every epoch whole.

Covered: ``Subscriber(start=, durable=, takeover=)``, ``sub.ack()``, ``Retention(...)``,
``History(source=, timeout=)``, ``History.epochs(since=, until=)``, ``History.to_arrow`` on a
msgpack topic, and the CLI (``tail --from/--durable``, ``history --since/--until``,
``durable ls|reset|drop``) through typer's CliRunner.

Failing on purpose (bugs):

- ``test_durable_new_name_at_unretained_position_creates_nothing``: a NEW durable name with a
  start older than what is retained raises ``SubscriptionExpired`` (not ``HistoryUnavailable``)
  and leaves the durable subscription created, at the refused position, expired for good;
- ``test_takeover_garbage_is_refused``: ``takeover="false"`` (any truthy garbage) silently takes
  a live holder's name and fences it;
- ``test_cli_garbage_positions['[[[[...']``: a deeply nested JSON position makes ``tail``,
  ``history`` and ``durable reset`` die with a RecursionError traceback;
- ``test_cli_refusals_change_nothing[tail t --from -1 --durable cli-old]``: the CLI face of the
  first bug;
- ``test_history_since_earliest_word``: ``History.epochs(since="earliest")`` raises a bare
  internal ``TypeError: '<=' not supported between instances of 'int' and 'str'``.
"""
from __future__ import annotations

import math
import tempfile
import threading

import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from hypothesis_profiles import examples

from epochstream import Catalog, History, Publisher, Retention, Subscriber
from epochstream.cli import app
from epochstream.errors import (CatalogError, HistoryUnavailable, ProtocolError,
                                SubscriptionExpired, SubscriptionHeld)
from epochstream.order import TIME_MAX, TIME_MIN, product

P2 = product(2)
N = 6  # epochs 0..5 of topic "t"
CLEAR = (ValueError, TypeError, ProtocolError)
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


# -- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world():
    """A catalog with a closed, logged total-order topic ``t`` (epochs 0..5, records [e, e]),
    a closed product(2) topic ``g`` ((d, i), d < 2, i < 2) and a durable subscription ``keep``
    of ``t`` at position [2] with nothing held."""
    cat = Catalog(tempfile.mkdtemp())
    with Publisher("t", catalog=cat, retention=Retention()) as pub:
        for e in range(N):
            pub.send(e, [e, e])
            pub.advance_to(e + 1)
    with Publisher("g", catalog=cat, order=P2, retention=Retention()) as pub:
        for d in range(2):
            for i in range(2):
                pub.send((d, i), [[d, i]])
        pub.advance_to((2, 0))
    Subscriber("t", catalog=cat, durable="keep", start=2, wait=0.5).close()
    return cat


def durables(cat: Catalog, topic: str = "t") -> list:
    return sorted((d.name, d.position, tuple(d.acked), d.state, d.holder)
                  for d in cat.durables(topic))


def check_t_intact(cat: Catalog) -> None:
    """The logs of ``t`` serve every epoch whole, from disk and to a fresh subscriber."""
    want = [(e, [e, e]) for e in range(N)]
    assert [(e.time, e.records) for e in History("t", catalog=cat).epochs()] == want
    with Subscriber("t", catalog=cat, start="earliest", wait=1.0) as sub:
        assert [(e.time, e.records) for e in sub.epochs(timeout=5)] == want


# -- value spaces --------------------------------------------------------------------------
out_of_range = st.integers().filter(lambda x: not TIME_MIN <= x <= TIME_MAX) | st.sampled_from(
    [1 << 64, -(1 << 63) - 1, 1 << 200])
not_a_time = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True), out_of_range,
    st.binary(max_size=5), st.sets(st.integers(0, 5), min_size=1, max_size=3),
    st.dictionaries(st.integers(0, 3), st.integers(0, 3), min_size=1, max_size=2),
    st.just(object()), st.just(float("nan")), st.just(1.0), st.just(complex(1, 0)))
bad_word = st.text(max_size=12).filter(lambda s: s not in ("earliest", "latest"))
# a frontier holding at least one non-time
bad_list = st.lists(st.integers(0, 5), max_size=3).flatmap(
    lambda ok: not_a_time.map(lambda bad: [*ok, bad]))
bad_total_start = st.one_of(not_a_time, bad_word, bad_list,
                            st.lists(st.lists(st.integers(0, 3), max_size=2), min_size=1,
                                     max_size=2),
                            st.just([(1,)]), st.just([[1, 2]]))
bad_product_start = st.one_of(
    not_a_time, bad_word, bad_list, st.integers(0, 5),
    st.tuples(st.integers(0, 3)), st.tuples(st.integers(0, 3), st.integers(0, 3),
                                            st.integers(0, 3)),
    st.lists(st.integers(0, 3), min_size=1, max_size=4),          # ints, not pairs
    st.lists(st.tuples(st.integers(0, 3)), min_size=1, max_size=2),
    st.just([(1, 1), (1,)]), st.just([(1, None)]), st.just([(1.0, 1)]), st.just((True, 1)),
    st.just((1 << 64, 0)), st.just([(0, 0), "x"]))


# -- Subscriber(start=...) -----------------------------------------------------------------
@settings(max_examples=examples(40))
@given(start=bad_total_start, durable=st.sampled_from([None, "keep", "fresh-total"]))
def test_subscriber_garbage_start_total(world, start, durable):
    """A garbage ``start`` (with or without a durable name, new or existing) is refused before
    anything is claimed or stored."""
    before = durables(world)
    with pytest.raises(CLEAR):
        Subscriber("t", catalog=world, start=start, durable=durable, wait=0.5).close()
    assert durables(world) == before


@settings(max_examples=examples(40))
@given(start=bad_product_start, durable=st.sampled_from([None, "fresh-grid"]))
def test_subscriber_garbage_start_product(world, start, durable):
    before = durables(world, "g")
    with pytest.raises(CLEAR):
        Subscriber("g", catalog=world, start=start, durable=durable, wait=0.5).close()
    assert durables(world, "g") == before


@settings(max_examples=examples(15))
@given(times=st.lists(st.integers(0, N + 1), min_size=1, max_size=5))
def test_start_list_with_duplicates_is_its_antichain(world, times):
    """A list with duplicates or comparable elements means its antichain (its minimum here)."""
    with Subscriber("t", catalog=world, start=times, wait=0.5) as sub:
        got = [(e.time, e.records) for e in sub.epochs(timeout=5)]
    assert got == [(e, [e, e]) for e in range(min(times), N)]


def test_unretained_start_without_durable(world):
    """A valid time older than what is retained: HistoryUnavailable with ``retained``."""
    with pytest.raises(HistoryUnavailable) as e:
        Subscriber("t", catalog=world, start=-1, wait=0.5).close()
    assert tuple(e.value.retained) == (0,)


def test_durable_new_name_at_unretained_position_creates_nothing(world):
    """BUG: a NEW durable subscription asked at a position older than what is retained must be
    refused with HistoryUnavailable (docs: "A subscriber asking for a position older than what
    is retained gets HistoryUnavailable") and must not exist afterwards. Today it raises
    SubscriptionExpired and is left stored at [-1], so every later
    ``Subscriber(durable="ghost", start="earliest")`` raises SubscriptionExpired until reset."""
    before = durables(world)
    with pytest.raises((HistoryUnavailable, SubscriptionExpired)) as e:
        Subscriber("t", catalog=world, start=-1, durable="ghost", wait=0.5).close()
    left = world.durable("t", "ghost")
    # cleanup first so the module's other tests stay independent of this bug
    world.durable_drop("t", "ghost")
    assert left is None, f"refused Subscriber left a durable subscription behind: {left}"
    assert type(e.value) is HistoryUnavailable, repr(e.value)
    assert durables(world) == before


# -- durable= and takeover= ----------------------------------------------------------------
@pytest.mark.parametrize("name", [1, 1.5, b"keep", "", "x" * 201, ["keep"], ("keep",), True],
                         ids=repr)
def test_durable_name_garbage(world, name):
    before = durables(world)
    with pytest.raises((CatalogError, ValueError, TypeError)):
        Subscriber("t", catalog=world, start="earliest", durable=name, wait=0.5).close()
    assert durables(world) == before


@pytest.mark.parametrize("name", ["é☃ billing", "a\x00b", " ", "x" * 200, "'; DROP TABLE durables;--"],
                         ids=["unicode", "nul", "space", "200chars", "sql"])
def test_durable_odd_names_are_distinct_and_exact(world, name):
    """Odd but valid names: stored exactly, independent of ``keep``, and resumable."""
    before = durables(world)
    try:
        with Subscriber("t", catalog=world, start=4, durable=name, wait=0.5) as sub:
            got = []
            for e in sub.epochs(timeout=5):
                got.append(e.time)
                sub.ack(e)
        assert got == [4, 5]
        assert world.durable("t", name).name == name
        with Subscriber("t", catalog=world, durable=name, wait=0.5) as sub:
            assert [e.time for e in sub.epochs(timeout=5)] == []
    finally:
        world.durable_drop("t", name)
    assert durables(world) == before


@pytest.mark.parametrize("takeover", ["false", "no", 1.5, [0], "0"], ids=repr)
def test_takeover_garbage_is_refused(world, takeover):
    """BUG: ``takeover`` is a bool; truthy garbage must be refused (TypeError/ValueError), not
    taken as ``True``. Today ``takeover="false"`` takes the name from a live holder, whose next
    ack is then refused (fenced)."""
    holder = Subscriber("t", catalog=world, start="earliest", durable="held", wait=0.5)
    try:
        other = None
        try:
            other = Subscriber("t", catalog=world, durable="held", takeover=takeover, wait=0.5)
        except (TypeError, ValueError, SubscriptionHeld):
            pass
        took = other is not None
        if other is not None:
            other.close()
        first = next(holder.epochs(timeout=5))
        fenced = False
        try:
            holder.ack(first)
        except SubscriptionHeld:
            fenced = True
        assert not took and not fenced, (f"takeover={takeover!r} took the name from a live "
                                         f"holder (fenced={fenced})")
    finally:
        holder.close()
        world.durable_drop("t", "held")


# -- ack -------------------------------------------------------------------------------------
ack_garbage = st.one_of(not_a_time, bad_word, st.lists(st.integers(0, 3), max_size=2),
                        st.tuples(st.integers(0, 3)), st.integers(-5, -1),
                        st.integers(N, N + 5), st.integers(2, N - 1))


def test_ack_garbage_changes_nothing(world):
    """Garbage acks, acks of epochs never handed out, of released-not-handed-out ones, and a
    double ack: ValueError each, the position (in the subscriber and the catalog) unchanged; a
    valid ack afterwards works and the resume is exact."""
    name = "acker"
    sub = Subscriber("t", catalog=world, start=0, durable=name, wait=0.5)
    try:
        it = sub.epochs(timeout=5)
        e0 = next(it)
        e1 = next(it)

        @settings(max_examples=examples(60))
        @given(v=ack_garbage)
        def garbage(v):
            before = (sub.position, world.durable("t", name).position,
                      world.durable("t", name).acked)
            with pytest.raises(ValueError):
                sub.ack(v)
            assert (sub.position, world.durable("t", name).position,
                    world.durable("t", name).acked) == before

        garbage()
        assert sub.position == (0,)
        sub.ack(e1)                          # out of order
        with pytest.raises(ValueError):
            sub.ack(e1)                      # twice
        with pytest.raises(ValueError):
            sub.ack(1.0)
        assert world.durable("t", name).position == (0,)
        assert tuple(world.durable("t", name).acked) == (1,)
        sub.ack(e0.time)
        assert sub.position == (2,) == world.durable("t", name).position
    finally:
        sub.close()
    with Subscriber("t", catalog=world, durable=name, wait=0.5) as again:
        assert [(e.time, e.records) for e in again.epochs(timeout=5)] == [
            (e, [e, e]) for e in range(2, N)]
    world.durable_drop("t", name)


def test_ack_without_durable_or_closed(world):
    with Subscriber("t", catalog=world, start=0, wait=0.5) as sub:
        e = next(sub.epochs(timeout=5))
        with pytest.raises(ValueError):
            sub.ack(e)
    sub = Subscriber("t", catalog=world, start=0, durable="closed-acker", wait=0.5)
    e = next(sub.epochs(timeout=5))
    sub.close()
    with pytest.raises(ValueError):
        sub.ack(e)
    assert world.durable("t", "closed-acker").position == (0,)
    world.durable_drop("t", "closed-acker")


# -- Retention ------------------------------------------------------------------------------
bad_limit = st.one_of(st.integers(max_value=0), st.floats(), st.booleans(), st.text(max_size=3),
                      st.just([1]), st.just(b"1"))
bad_age = st.one_of(st.floats().filter(lambda f: not (math.isfinite(f) and f > 0)),
                    st.integers(max_value=0), st.booleans(), st.text(max_size=3), st.just([1.0]))


@settings(max_examples=examples(50))
@given(field=st.sampled_from(["max_bytes", "max_epochs", "max_age", "segment_bytes", "fsync",
                              "dir"]), data=st.data())
def test_retention_garbage(field, data):
    value = data.draw({"max_bytes": bad_limit, "max_epochs": bad_limit, "max_age": bad_age,
                       "segment_bytes": bad_limit | st.integers(1, 4095),
                       "fsync": st.one_of(st.none(), st.integers(), bad_word.filter(
                           lambda s: s not in ("frontier", "none", "every"))),
                       "dir": st.one_of(st.integers(), st.binary(max_size=3), st.just([".."]))
                       }[field])
    with pytest.raises(ValueError):
        Retention(**{field: value})
    with pytest.raises(ValueError):
        Retention().replace(**{field: value})


# -- History ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(source="x"), dict(source="DISK"), dict(source=1),
                                dict(timeout="x"), dict(timeout=None), dict(timeout=[1])],
                         ids=repr)
def test_history_constructor_garbage(world, kw):
    with pytest.raises(CLEAR):
        History("t", catalog=world, **kw)
    check_t_intact(world)


@settings(max_examples=examples(50))
@given(which=st.sampled_from(["since", "until"]),
       value=bad_total_start.filter(lambda v: v is not None and v not in ("earliest", "latest")))
def test_history_garbage_since_until(world, which, value):
    h = History("t", catalog=world)
    with pytest.raises(CLEAR):
        list(h.epochs(**{which: value}))
    with pytest.raises(CLEAR):
        h.records(**{which: value})


@settings(max_examples=examples(30))
@given(which=st.sampled_from(["since", "until"]), value=bad_product_start.filter(
    lambda v: v is not None and v not in ("earliest", "latest")))
def test_history_garbage_since_until_product(world, which, value):
    with pytest.raises(CLEAR):
        list(History("g", catalog=world).epochs(**{which: value}))


def test_history_unretained_since(world):
    with pytest.raises(HistoryUnavailable) as e:
        list(History("t", catalog=world).epochs(since=-1))
    assert tuple(e.value.retained) == (0,)


def test_history_since_earliest_word(world):
    """BUG: ``since="earliest"`` (the word Subscriber(start=) and ``history --since`` take) must
    either mean everything retained or be a clear ValueError; today it is a bare internal
    ``TypeError: '<=' not supported between instances of 'int' and 'str'`` (resolve_position
    returns the string, which History wraps in an Antichain character by character)."""
    h = History("t", catalog=world)
    try:
        got = [e.time for e in h.epochs(since="earliest")]
    except ValueError:
        return
    except TypeError as e:
        pytest.fail(f"since='earliest' -> internal TypeError: {e}")
    assert got == list(range(N))


def test_to_arrow_on_msgpack_topic(world):
    h = History("t", catalog=world)
    with pytest.raises(TypeError, match="msgpack"):
        h.to_arrow()
    with pytest.raises(TypeError):
        h.to_arrow(since="x")
    check_t_intact(world)


# -- the CLI -----------------------------------------------------------------------------
GARBAGE_TEXT = ["x", "", "1.5", "nan", "1e3", "true", "null", "{}", "[null]", "[1.5]",
                str(1 << 70), "[[1]]", "[[1,2],[1]]", '"earliest"', "EARLIEST", "1,,2", "\x01",
                "[" * 3000, "9" * 5000]


def _invoke(cat, *args):
    res = CliRunner(env=ENV).invoke(app, [*args, "--catalog", str(cat.path)])
    return res


def _assert_usage_error(res, args):
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        args, repr(res.exception))
    assert res.exit_code == 2, (args, res.exit_code, res.output[-500:])
    out = res.output
    assert "Traceback" not in out, (args, out[-500:])
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, (args, out[-500:])


@pytest.mark.parametrize("text", GARBAGE_TEXT, ids=lambda s: repr(s[:12]))
def test_cli_garbage_positions(world, text):
    before = durables(world), durables(world, "g")
    for args in (("tail", "t", "--from", text, "--max-epochs", "1", "--timeout", "2"),
                 ("tail", "t", "--from", text, "--durable", "cli-new", "--timeout", "2"),
                 ("history", "t", "--since", text), ("history", "g", "--until", text),
                 ("durable", "reset", "t", "keep", "--to", text)):
        _assert_usage_error(_invoke(world, *args), args)
    assert (durables(world), durables(world, "g")) == before


@pytest.mark.parametrize("args", [
    ("tail", "t", "--from", "-1"),                     # older than retained
    ("tail", "t", "--from", "-1", "--durable", "cli-old"),
    ("history", "t", "--since", "-1"),
    ("durable", "reset", "t", "keep", "--to", "-1"),
    ("durable", "reset", "t", "nosuch"),
    ("durable", "drop", "t", "nosuch"),
    ("durable", "reset", "g", "keep", "--to", "1"),    # unknown name on g; total time on g
    ("history", "g", "--since", "1"),
    ("history", "t", "--until", "1,2"),
], ids=lambda a: " ".join(a))
def test_cli_refusals_change_nothing(world, args):
    before = durables(world), durables(world, "g")
    res = _invoke(world, *args, *(("--timeout", "2") if args[0] == "tail" else ()))
    left = world.durable("t", "cli-old")
    if left is not None:
        world.durable_drop("t", "cli-old")
    _assert_usage_error(res, args)
    assert left is None, f"refused `{' '.join(args)}` left {left}"
    assert (durables(world), durables(world, "g")) == before


def test_cli_durable_on_unknown_topic_and_held_name(world):
    before = durables(world)
    for args in (("durable", "ls", "nope"), ("durable", "reset", "nope", "keep"),
                 ("durable", "drop", "nope", "keep"), ("history", "nope")):
        res = _invoke(world, *args)
        assert res.exit_code in (1, 2) and "Traceback" not in res.output, (args, res.output)
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    holder = Subscriber("t", catalog=world, durable="keep", wait=0.5)
    try:
        for args in (("durable", "reset", "t", "keep", "--to", "3"),
                     ("durable", "drop", "t", "keep")):
            res = _invoke(world, *args)
            assert res.exit_code == 1, (args, res.output)
        assert world.durable("t", "keep").holder == holder.id
    finally:
        holder.close()
    assert durables(world) == before
    check_t_intact(world)


# -- a live publisher among offenders ------------------------------------------------------
def test_live_publisher_and_subscriber_unaffected_by_offenders():
    """While a publisher runs and a well-formed subscriber reads, every kind of offender is
    refused; the subscriber gets every epoch whole, the log holds them all, and the durable
    position of a well-formed durable subscriber is exactly what it acked."""
    cat = Catalog(tempfile.mkdtemp())
    total = 30
    pub = Publisher("live", catalog=cat, retention=Retention())
    pub.send(0, [0, 1])
    pub.advance_to(1)
    good = Subscriber("live", catalog=cat, start="earliest", wait=2.0)
    dur = Subscriber("live", catalog=cat, start="earliest", durable="d", wait=2.0)
    go = threading.Event()
    errors: list = []

    def publish():
        try:
            go.wait(5)
            for e in range(1, total):
                pub.send(e, [2 * e, 2 * e + 1])
                pub.advance_to(e + 1)
            pub.flush()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    th = threading.Thread(target=publish, daemon=True)
    th.start()
    go.set()
    refused = 0
    for bad in (None, 1.5, "x", [None], {1}, b"1", 1 << 70, True):
        with pytest.raises(CLEAR):
            Subscriber("live", catalog=cat, start=bad, durable="d2", wait=0.5)
        refused += 1
    for name in ("", 7, b"d"):
        with pytest.raises((CatalogError, ValueError, TypeError)):
            Subscriber("live", catalog=cat, start="earliest", durable=name, wait=0.5)
    with pytest.raises(SubscriptionHeld):
        Subscriber("live", catalog=cat, durable="d", wait=0.5)
    for bad in (None, 1.5, "0", [0], 99):
        with pytest.raises(ValueError):
            dur.ack(bad)
    for bad in ("x", 1.5, [None]):
        with pytest.raises(CLEAR):
            list(History("live", catalog=cat).epochs(since=bad))
    th.join(30)
    assert not errors, errors
    pub.close()
    want = [(e, [2 * e, 2 * e + 1]) for e in range(total)]
    got = [(e.time, e.records) for e in good.epochs(timeout=10)]
    good.close()
    assert got == want
    seen = []
    for e in dur.epochs(timeout=10):
        seen.append((e.time, e.records))
        if e.time < total // 2:
            dur.ack(e)
    assert seen == want
    assert dur.position == (total // 2,) == cat.durable("live", "d").position
    dur.close()
    assert [(e.time, e.records) for e in History("live", catalog=cat).epochs()] == want
    assert cat.durable("live", "d2") is None
    assert [d.name for d in cat.durables("live")] == ["d"]


@pytest.mark.parametrize("kwargs", [dict(timeout=float("nan")), dict(timeout=-1), dict(timeout=0),
                                    dict(timeout=float("inf")), dict(timeout=True),
                                    dict(source=""), dict(source="Disk")])
def test_history_refuses_a_timeout_that_is_not_seconds_and_an_empty_source(tmp_path, kwargs):
    """A nan, negative or infinite timeout would make a remote read never (or always) time
    out, and source="" silently meant "auto": each is a ValueError now."""
    from epochstream import Catalog, History
    cat = Catalog(tmp_path / "c")
    cat.create_topic("t")
    with pytest.raises(ValueError):
        History("t", catalog=cat, **kwargs)
