from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferq.shared.schema import LANES
from inferq.worker.policy.lanes import lane_order
from inferq.worker.policy.scheduler import LiveCeiling


def test_oom_lowers_below_the_failed_size_and_successes_raise_it_back() -> None:
    c = LiveCeiling(ceiling=800, floor=10, recover_after=3)
    assert c.on_oom(400) < 400 and c.lowered == 1
    low = c.value
    for _ in range(2):
        assert c.on_success() == low  # not yet
    assert c.on_success() == low + 100  # one step (1/8 of the ceiling) after 3 successes
    while c.value < 800:
        c.on_success()
    assert c.value == 800 and c.on_success() == 800  # never above the calibrated ceiling


def test_oom_never_goes_below_the_floor_and_an_oom_resets_the_streak() -> None:
    c = LiveCeiling(ceiling=100, floor=40, recover_after=2)
    assert c.on_oom(41) == 40
    c.on_success()
    c.on_oom(1000)  # above the current value: nothing to lower, but the streak restarts
    assert c.on_success() == 40


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(1, 5000), st.none()), max_size=200))
def test_ceiling_invariants(events: list[int | None]) -> None:
    c = LiveCeiling(ceiling=2048, floor=16, recover_after=4)
    for e in events:
        before = c.value
        if e is None:
            c.on_success()
        else:
            c.on_oom(e)
            assert c.value < e or c.value == c.floor or c.value == before
        assert c.floor <= c.value <= c.ceiling


def test_bad_bounds() -> None:
    with pytest.raises(ValueError):
        LiveCeiling(ceiling=10, floor=20, recover_after=1)


def test_lane_order_prefers_high_but_never_starves() -> None:
    firsts = [lane_order(i, LANES)[0] for i in range(64)]
    assert firsts.count("high") == 48 and firsts.count("normal") == 8 and firsts.count("low") == 8
    for i in range(64):
        assert sorted(lane_order(i, LANES)) == ["high", "low", "normal"]
    # every window of 8 consecutive reads lets each lane go first at least once
    for start in range(56):
        assert {lane_order(i, LANES)[0] for i in range(start, start + 8)} == {
            "high",
            "normal",
            "low",
        }
