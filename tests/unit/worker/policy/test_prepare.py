"""Where a claim is prepared: the pure rule (`worker/policy/prepare.py`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from inferq.worker.policy.prepare import PrepareCost, size_class


def test_sizes_share_a_class_within_a_power_of_two() -> None:
    assert [size_class(n) for n in (0, 1, 2, 3, 4, 7, 8, 1023, 1024, 2047)] == [
        0, 1, 2, 2, 3, 3, 4, 10, 11, 11,
    ]  # fmt: skip
    assert size_class(-5) == 0


def test_nothing_is_prepared_on_the_loop_before_a_claim_of_its_size_was_measured() -> None:
    cost = PrepareCost(limit_s=0.0002)
    assert not any(cost.inline(size) for size in (0, 1, 10, 10**9))
    cost.observe(100, 0.00001)
    assert cost.inline(64) and cost.inline(127)  # the same class: 64-127 bytes
    assert not cost.inline(63) and not cost.inline(128)  # never measured


def test_a_claim_goes_on_the_loop_while_its_class_costs_within_the_limit() -> None:
    cost = PrepareCost(limit_s=0.0002)
    cost.observe(40, 0.00002)  # a small claim: its cost is the call's own
    cost.observe(5000, 0.0003)  # a large one: over the limit
    assert cost.inline(40) and not cost.inline(5000)
    cost.observe(40, -1.0)  # a clock that went back counts as nothing, not as a credit
    assert cost.seconds[size_class(40)] == 0.00002 * 0.75


def test_a_slow_call_sends_its_class_back_to_the_thread_and_fast_ones_bring_it_back() -> None:
    cost = PrepareCost(limit_s=0.0002)
    cost.observe(100, 0.00001)
    assert cost.inline(100)
    cost.observe(100, 0.05)  # one call of 50 ms (inputs far costlier than the rest)
    assert not cost.inline(100)
    calls = 0
    while not cost.inline(100):
        cost.observe(100, 0.00001)
        calls += 1
    assert 10 <= calls <= 20  # the average forgets it, a quarter at a time


@settings(max_examples=300, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.integers(0, 10**6), st.floats(0, 1, allow_nan=False)), min_size=1, max_size=40
    ),
    size=st.integers(0, 10**6),
    limit=st.floats(1e-6, 1e-2),
)
def test_each_class_estimate_stays_within_what_it_saw_and_the_rule_reads_it(
    calls: list[tuple[int, float]], size: int, limit: float
) -> None:
    cost = PrepareCost(limit_s=limit)
    seen: dict[int, list[float]] = {}
    for n, seconds in calls:
        cost.observe(n, seconds)
        seen.setdefault(size_class(n), []).append(seconds)
    assert set(cost.seconds) == set(seen)
    for k, took in seen.items():
        assert min(took) * (1 - 1e-9) <= cost.seconds[k] <= max(took) * (1 + 1e-9)
    k = size_class(size)
    assert cost.inline(size) == (k in seen and cost.seconds[k] <= limit)
