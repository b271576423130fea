"""`Admission` is pure: its invariants, checked over the whole input space (hypothesis) and
on the cases a reader would check by hand."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from inferq.api.core.admission import REASONS, Admission

ADMIT = Admission(max_queue=1000, max_queue_bytes=1 << 20)
rates = st.one_of(st.just(0.0), st.floats(min_value=0.01, max_value=1e5))
items = st.integers(min_value=1, max_value=500)
depths = st.integers(min_value=0, max_value=5000)
timeouts = st.floats(min_value=0.01, max_value=86_400)


@given(items, rates, timeouts)
def test_the_limit_admits_a_job_alone_and_never_passes_the_cap(
    n: int, rate: float, t: float
) -> None:
    limit = ADMIT.limit(n, rate, t)
    assert limit <= ADMIT.max_queue
    if rate > 0:
        assert limit >= min(n, ADMIT.max_queue)  # alone in an empty queue: never too slow
        assert limit <= max(n, int(rate * t))  # what finishes before the deadline
    else:
        assert limit == ADMIT.max_queue  # no rate yet: only the cap


@given(depths, items, rates, timeouts)
def test_every_item_refusal_has_a_known_reason_and_a_retry(
    depth: int, n: int, rate: float, t: float
) -> None:
    e = ADMIT.too_many_items("m", depth, n, rate, t)
    assert e.reason in REASONS and e.reason != "queue_bytes"
    assert e.retry_after_s >= 1 and isinstance(e.retry_after_s, int)
    if depth + n > ADMIT.max_queue or rate <= 0:
        assert e.reason == "queue_full" and "INFERQ_MAX_QUEUE=1000" in str(e)
    else:
        assert e.reason == "deadline" and f"{t:g}s" in str(e)


@given(depths, items, st.floats(min_value=0.01, max_value=1e5), timeouts)
def test_retry_after_is_the_time_for_the_excess_to_drain(
    depth: int, n: int, rate: float, t: float
) -> None:
    e = ADMIT.too_many_items("m", depth, n, rate, t)
    excess = depth + n - ADMIT.limit(n, rate, t)
    assert e.retry_after_s == max(1, math.ceil(excess / rate))


@given(depths, items, rates)
def test_a_byte_refusal_names_its_setting_and_asks_for_the_jobs_own_time(
    held: int, n: int, rate: float
) -> None:
    e = ADMIT.too_many_bytes("m", held, n, rate)
    assert e.reason == "queue_bytes" and f"INFERQ_MAX_QUEUE_BYTES={1 << 20}" in str(e)
    assert e.retry_after_s == (max(1, math.ceil(n / rate)) if rate > 0 else 1)


def test_by_hand() -> None:
    a = Admission(max_queue=100, max_queue_bytes=10)
    assert a.limit(5, 10.0, 3.0) == 30  # 10 items/s for 3 s
    assert a.limit(50, 10.0, 3.0) == 50  # one big job alone still fits
    assert a.limit(5, 1000.0, 3.0) == 100  # fast workers: the cap
    full = a.too_many_items("m", depth=99, items=5, rate=10.0, timeout_s=60.0)
    assert (full.reason, full.retry_after_s) == ("queue_full", 1)  # 4 over at 10/s → 1 s
    slow = a.too_many_items("m", depth=40, items=5, rate=10.0, timeout_s=3.0)
    assert (slow.reason, slow.retry_after_s) == ("deadline", 2)  # 15 over at 10/s → 2 s
    assert "predicted wait 4.0s (40 items at 10/s)" in str(slow)
    cold = a.too_many_items("m", depth=250, items=1, rate=0.0, timeout_s=3.0)
    assert (cold.reason, cold.retry_after_s) == ("queue_full", 3)  # 250 at an assumed 100/s
