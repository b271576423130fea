"""Quotas Redis cannot check in the same step as the write: this process's creations under way.

A tenant's files and batches are counted by reading Redis (`FileStore.usage`,
`BatchStore.running`), and the write that adds one comes several awaits later (the upload
is written, the batch file read and checked). Concurrent requests of one tenant would all
pass one read. So each creation is counted here, by its id, from its check (entered with no
await after it) until it is written and listed; and one that lands while a read is under way
stays counted for that read, which may or may not have seen it: its id says which, so none is
missed or counted twice. Requests to other API processes show once written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field


@dataclass
class _Tenant:
    sizes: dict[str, int] = field(default_factory=dict)  # id → size, under way or landed
    landed: set[str] = field(default_factory=set)  # of `sizes`: written already
    readers: int = 0  # reads under way


class Pending:
    """One kind of creation (uploads, batches), by tenant."""

    def __init__(self) -> None:
        self._tenants: dict[str, _Tenant] = {}

    async def count(
        self, tenant: str, read: Callable[[], Awaitable[Mapping[str, int]]]
    ) -> tuple[int, int]:
        """(count, total size) of what `read` finds (id → size of what the tenant keeps),
        plus this process's creations it did not see."""
        t = self._tenants.setdefault(tenant, _Tenant())
        t.readers += 1
        try:
            seen = await read()
            extra = [n for i, n in t.sizes.items() if i not in seen]
        finally:
            t.readers -= 1
            if not t.readers:
                t.sizes = {i: n for i, n in t.sizes.items() if i not in t.landed}
                t.landed.clear()
                self._forget(tenant, t)
        return len(seen) + len(extra), sum(seen.values()) + sum(extra)

    @contextlib.contextmanager
    def adding(self, tenant: str, item_id: str, size: int = 1) -> Iterator[None]:
        """Count `item_id` in `count` while it is created (and, once landed, for the reads
        under way). Enter it with no await after the quota check."""
        t = self._tenants.setdefault(tenant, _Tenant())
        t.sizes[item_id] = size
        try:
            yield
        finally:
            if t.readers:  # a read under way may have missed it: kept until the reads end
                t.landed.add(item_id)
            else:
                del t.sizes[item_id]
                self._forget(tenant, t)

    def held(self) -> int:
        """Creations counted now, all tenants (0 once none is under way nor being read)."""
        return sum(len(t.sizes) for t in self._tenants.values())

    def _forget(self, tenant: str, t: _Tenant) -> None:
        if not t.sizes and not t.readers and self._tenants.get(tenant) is t:
            del self._tenants[tenant]
