"""The event vocabulary (epochstream.events): frozen values, Gap's algebra, and the deprecated
(message, nbytes) pair shape of events()."""
import dataclasses

import hypothesis.strategies as st
import pytest
from hypothesis import given

from epochstream.events import DataMessage, Epoch, Gap, InitialFrontierSnapshot, LowerFrontierUpdate
from epochstream.order import TOTAL, product


def test_events_are_frozen():
    for event in (DataMessage(1, [1], 3), LowerFrontierUpdate(((1, 1),)),
                  InitialFrontierSnapshot((0,), ()), Epoch(1, [1]),
                  Gap("lagged", 0, None, (0,), (3,), (2,), TOTAL)):
        before = repr(event)
        # FrozenInstanceError; TypeError on Python 3.11 for frozen slotted dataclasses (CPython
        # gh-90562); AttributeError for a name that is not a field of a slotted class
        with pytest.raises((dataclasses.FrozenInstanceError, TypeError, AttributeError)):
            event.time = 5  # type: ignore[misc]
        assert repr(event) == before


def test_gap_compares_without_its_order_and_is_built_complete():
    a = Gap("restarted", 1, 4, (5,), (9,), (7,), TOTAL)
    b = Gap("restarted", 1, 4, (5,), (9,), (7,), product(1))
    assert a == b and "order" not in repr(a)
    assert dataclasses.replace(a, last_epoch=6).last_epoch == 6


@given(st.integers(0, 12))
def test_gap_may_have_missed_exactly_the_epochs_between_since_and_until_or_through(t):
    gap = Gap("lagged", 0, 4, since=(5,), until=(9,), through=(10,), order=TOTAL)
    # at or beyond since (5) and (below until (9) or at/below through (10))
    assert gap.may_have_missed(t) == (5 <= t and (t < 9 or t <= 10))


def test_gap_on_product_times():
    P = product(2)
    gap = Gap("restarted", 0, None, since=((1, 0),), until=((3, 0), (0, 3)), through=((2, 2),), order=P)
    assert gap.may_have_missed((1, 1))       # beyond since, below until
    assert not gap.may_have_missed((0, 0))   # not beyond since: delivered before
    assert not gap.may_have_missed((4, 4))   # beyond until, not at or below through
    assert gap.may_have_missed((2, 2))       # at or below through: begun before the re-join


def test_events_as_pairs_warn_and_keep_the_old_shape():
    msg = DataMessage(3, [1, 2], 17)
    with pytest.warns(DeprecationWarning, match="event.nbytes"):
        m, n = msg
    assert m is msg and n == 17
    with pytest.warns(DeprecationWarning):
        assert msg[1] == 17 and msg[0] is msg
    with pytest.warns(DeprecationWarning):
        assert LowerFrontierUpdate(((0, -1),))[1] == 0
