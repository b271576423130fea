"""Blocking reads over a sharded queue on a Redis Cluster.

One XREADGROUP may only name streams of one slot, and a model's shards live in different
slots (on different nodes). Reading them one after another would leave a job on the last
shard waiting out every earlier shard's BLOCK. So each shard keeps one blocking read in
flight; `next` returns what the first reads to answer delivered, and leaves the others
running for the next call, never cancelled: a cancelled read whose entries the server had
already delivered would strand them in this worker's pending list. `settle` (at stop) waits
for the reads still out, so the worker can hand back what they bring.

A read in flight was sized for the room the worker had when it started, so the worker can
briefly hold up to one read's count per shard more than `INFERQ_PREFETCH_ITEMS`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from inferq.shared.queue import Entry

Read = Callable[[int], Awaitable[list[Entry]]]


class ShardReads:
    def __init__(self) -> None:
        self._out: dict[int, asyncio.Task[list[Entry]]] = {}

    async def next(self, shards: Iterable[int], read: Read, timeout_s: float) -> list[Entry]:
        """Start a blocking `read(shard)` for each shard without one in flight; return the
        entries of those that answer first (empty after `timeout_s`)."""
        for shard in shards:
            if shard not in self._out:
                self._out[shard] = asyncio.ensure_future(read(shard))
        done, _ = await asyncio.wait(
            self._out.values(), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        return self._harvest(done, raise_errors=True)

    async def settle(self) -> list[Entry]:
        """Wait for every read still in flight; what they delivered (failures: nothing)."""
        if not self._out:
            return []
        done, _ = await asyncio.wait(self._out.values())
        return self._harvest(done, raise_errors=False)

    def _harvest(self, done: set[asyncio.Task[list[Entry]]], *, raise_errors: bool) -> list[Entry]:
        got: list[Entry] = []
        error: BaseException | None = None
        for shard, task in list(self._out.items()):
            if task not in done:
                continue
            del self._out[shard]
            if task.exception() is not None:
                error = error or task.exception()
            else:
                got += task.result()
        # A failed read delivered nothing it returned: the caller re-reads its pending list.
        if error is not None and raise_errors and not got:
            raise error
        return got
