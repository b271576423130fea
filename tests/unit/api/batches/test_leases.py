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


async def _until(cond: Any, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


class FlakyRunStore:
    """A batch whose runs and renewals fail, with Redis refusals and bugs, before they work:
    `load` fails `load_errors` times, then waits for `finish` and finds the batch gone;
    `renew` fails `renew_errors` times, then keeps the lease."""

    def __init__(self, load_errors: int, renew_errors: int) -> None:
        self.load_errors, self.renew_errors = load_errors, renew_errors
        self.loads = self.renewals = 0
        self.finish = asyncio.Event()
        self.deactivated: list[str] = []
        self.released: list[str] = []

    def _error(self, n: int) -> Exception:
        if n % 2:
            return RuntimeError("a bug")
        return ResponseError("OOM command not allowed when used memory > 'maxmemory'.")

    async def load(self, batch_id: str) -> None:
        self.loads += 1
        if self.loads <= self.load_errors:
            raise self._error(self.loads)
        await self.finish.wait()

    async def deactivate(self, batch_id: str) -> None:
        self.deactivated.append(batch_id)

    async def renew(self, batch_id: str, owner: str, lease_ms: int) -> bool:
        self.renewals += 1
        if self.renewals <= self.renew_errors:
            raise self._error(self.renewals)
        return True

    async def release(self, batch_id: str, owner: str) -> None:
        self.released.append(batch_id)


def _count(metrics: Any, loop: str) -> float:
    return float(metrics.background_errors.labels(loop=loop)._value.get())


async def test_a_run_and_its_renewals_survive_any_error_and_count_it(monkeypatch: Any) -> None:
    monkeypatch.setattr(leases_module, "RENEW_S", 0.01)
    store, metrics = FlakyRunStore(load_errors=2, renew_errors=3), api_metrics()
    runner = BatchLeases(store, None, None, metrics)  # type: ignore[arg-type]
    hold = asyncio.create_task(runner._hold("batch_x"))
    runner._held["batch_x"] = hold
    try:
        # The run starts over after each failure (backoff 0.1 s, then 0.2 s) and the lease
        # is renewed on through the renewals' failures.
        await _until(lambda: store.loads == 3 and store.renewals > 6, 5, "the run and renewals")
        assert not hold.done()
        assert _count(metrics, "batch_run") == 2 and _count(metrics, "batch_leases") == 3
        store.finish.set()  # the batch ends: the run returns, the lease is handed back
        await asyncio.wait_for(hold, 5)
    finally:
        hold.cancel()
    assert store.deactivated == ["batch_x"] and store.released == ["batch_x"]
    assert "batch_x" not in runner._held
