"""Which batches a process takes (tenants in turn), and a scanner that outlives any failure."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import ResponseError

from inferq.api.batches import leases as leases_module
from inferq.api.batches.leases import BatchLeases, fair_order
from inferq.shared.errors import QueueUnavailable
from inferq.shared.metrics import api_metrics


def test_tenants_take_turns_counting_what_each_already_runs() -> None:
    many = [(f"batch_a{i:02}", "a") for i in range(30)]
    assert fair_order([*many, ("batch_b00", "b")])[:4] == [
        "batch_a00",
        "batch_b00",
        "batch_a01",
        "batch_a02",
    ]
    # a already runs 4 here: the next free slot is b's, however many a has waiting.
    assert fair_order([*many, ("batch_b00", "b")], {"a": 4})[0] == "batch_b00"
    assert fair_order([], {"a": 1}) == []


@given(
    st.lists(st.tuples(st.text(min_size=1), st.sampled_from("abcd")), unique_by=lambda x: x[0]),
    st.dictionaries(st.sampled_from("abcd"), st.integers(0, 5)),
)
def test_each_pick_goes_to_a_tenant_with_the_fewest_running(
    batches: list[tuple[str, str]], running: dict[str, int]
) -> None:
    order = fair_order(batches, running)
    assert sorted(order) == sorted(b for b, _ in batches)
    tenant = dict(batches)
    load = {t: running.get(t, 0) for t in tenant.values()}
    left = {t: sum(1 for _, u in batches if u == t) for t in load}
    for b in order:
        t = tenant[b]
        assert load[t] == min(load[u] for u in load if left[u]), (t, load)
        load[t] += 1
        left[t] -= 1


class FlakyStore:
    """A store whose scan fails, with every kind of error, before it answers."""

    def __init__(self) -> None:
        self.errors: list[Exception] = [
            ResponseError("NOREPLICAS Not enough good replicas to write."),
            ResponseError("MISCONF Redis is configured to save RDB snapshots"),
            QueueUnavailable("redis unavailable"),
            RuntimeError("a bug"),
        ]
        self.scans = 0

    async def active_with_tenants(self) -> list[tuple[str, str]]:
        self.scans += 1
        if self.errors:
            raise self.errors.pop(0)
        return []


async def test_the_scanner_survives_any_error_and_counts_it(monkeypatch: Any) -> None:
    real_sleep = asyncio.sleep

    async def no_wait(delay: float, *args: Any) -> None:
        await real_sleep(0)

    monkeypatch.setattr(leases_module.asyncio, "sleep", no_wait)
    monkeypatch.setattr(leases_module, "SCAN_S", 0.01)
    store, metrics = FlakyStore(), api_metrics()
    runner = BatchLeases(store, None, None, metrics)  # type: ignore[arg-type]
    await runner.start()
    try:
        deadline = asyncio.get_running_loop().time() + 5
        while store.scans < 6:  # past all four failures, and scanning on
            assert asyncio.get_running_loop().time() < deadline, store.scans
            await real_sleep(0.01)
        assert runner._task is not None and not runner._task.done()
        counted = metrics.background_errors.labels(loop="batch_leases")._value.get()
        assert counted == 4
    finally:
        await runner.stop()
