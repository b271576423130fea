"""The bounds for a batch that would run beside others (worker.streams)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferq.worker.policy.scheduler import BUSY_WAIT_SHARE, Limits, limits, smooth


def test_idle_device_or_one_stream_keeps_the_configured_bounds() -> None:
    assert limits(0, 2, 32, 0.0, 0.1) == Limits(32, 0.0)
    assert limits(0, 4, 32, 0.005, 0.1) == Limits(32, 0.005)
    assert limits(1, 1, 32, 0.0, 0.1) == Limits(32, 0.0)  # a GPU's one stream never waits more


def test_beside_a_running_batch_wait_for_a_share() -> None:
    assert limits(1, 2, 32, 0.0, 0.1) == Limits(16, pytest.approx(BUSY_WAIT_SHARE * 0.1))
    assert limits(3, 4, 32, 0.0, 0.2) == Limits(8, pytest.approx(BUSY_WAIT_SHARE * 0.2))
    assert limits(1, 2, 32, 0.5, 0.1) == Limits(16, 0.5)  # never less than the configured wait
    assert limits(1, 4, 2, 0.0, 0.0) == Limits(1, 0.0)  # at least one item; no history: no wait


@given(
    running=st.integers(0, 8),
    streams=st.integers(1, 8),
    size=st.integers(1, 256),
    wait=st.floats(0, 1),
    recent=st.floats(-1, 10),
)
def test_bounds_stay_sane(
    running: int, streams: int, size: int, wait: float, recent: float
) -> None:
    lim = limits(running, streams, size, wait, recent)
    assert 1 <= lim.max_batch_size <= size
    assert wait <= lim.max_wait_s <= max(wait, BUSY_WAIT_SHARE * max(recent, 0.0))
    if running == 0 or streams == 1:
        assert lim == Limits(size, wait)


def test_smooth() -> None:
    assert smooth(0.0, 0.3) == 0.3  # the first batch sets it
    assert smooth(0.1, 0.2) == pytest.approx(0.12)
    x = 0.0
    for _ in range(100):
        x = smooth(x, 0.05)
    assert x == pytest.approx(0.05)
