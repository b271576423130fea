"""`Pending`: a tenant's creations under way counted once by a quota read, whatever the
interleaving of reads and landings (the reads are driven by hand)."""

from __future__ import annotations

import asyncio

from inferq.api.batches.pending import Pending


class Store:
    """What Redis lists per tenant (id → size); a read answers from it as it is when the
    read is answered, and reaches its caller only when released."""

    def __init__(self) -> None:
        self.kept: dict[str, int] = {}
        self.gates: list[asyncio.Event] = []

    async def read(self) -> dict[str, int]:
        answer = dict(self.kept)
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return answer


async def test_overlapping_reads_each_count_a_landing_once() -> None:
    store, pending = Store(), Pending()
    store.kept["old"] = 5
    first = asyncio.create_task(pending.count("a", store.read))
    await asyncio.sleep(0)  # the first read is answered: it saw only "old"
    with pending.adding("a", "new", 7):
        store.kept["new"] = 7  # lands while the first read is under way
    second = asyncio.create_task(pending.count("a", store.read))
    await asyncio.sleep(0)  # the second read saw "new" in the store
    for gate in store.gates:
        gate.set()
    assert await first == (2, 12)  # from this process's count
    assert await second == (2, 12)  # from the store, not counted twice
    assert pending.held() == 0
    assert await _now(pending, store) == (2, 12)


async def test_a_creation_under_way_counts_until_it_ends_either_way() -> None:
    store, pending = Store(), Pending()
    with pending.adding("a", "x", 3), pending.adding("b", "y"):
        assert await _now(pending, store, "a") == (1, 3)
        assert await _now(pending, store, "b") == (1, 1)  # each tenant its own
    assert await _now(pending, store, "a") == (0, 0)  # failed before it was written: gone
    assert pending.held() == 0


async def _now(pending: Pending, store: Store, tenant: str = "a") -> tuple[int, int]:
    task = asyncio.create_task(pending.count(tenant, store.read))
    await asyncio.sleep(0)
    store.gates[-1].set()
    return await task
