"""Finished results on their way to Redis: posted in the order they finished, never dropped.

`post` queues a job's final outcome, `ack` an entry to acknowledge without a result (its job
was already final: a duplicate delivery, or cancelled elsewhere). `run` writes whatever is
queued in one `JobConsumer.finish` round trip (result → notify → XACK, atomically) and, while
Redis is unavailable, keeps it all and retries with backoff: a result computed during an
outage is posted when Redis answers again. Posting is idempotent (the finish script never
overwrites a final record), so a retry after a lost reply changes nothing. `run` is a
supervised loop (`inferq.shared.supervise`, STOP, loop `publish`): any other failure ends
the worker.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import Counter

from inferq.shared.consumer import JobConsumer
from inferq.shared.errors import QueueUnavailable
from inferq.shared.queue import Entry, Final
from inferq.shared.supervise import STOP, Supervisor

log = logging.getLogger("inferq.worker")


class Outbox:
    def __init__(self, queue: JobConsumer, errors: Counter | None = None) -> None:
        """`errors`: the worker's `inferq_background_errors` counter (None: not counted)."""
        self.queue = queue
        # Unbounded on purpose: a finished result must never be dropped or block the device.
        self._pending: asyncio.Queue[Final | Entry] = asyncio.Queue()
        self.posting: set[str] = set()  # job ids finalised here and not yet written
        self.unavailable_since: float | None = None  # loop time of the first failed post
        self._in_flight = 0  # taken off the queue, not yet written
        self._taken: list[Final | Entry] | None = None  # what `run` retries until written
        self._supervisor = Supervisor("publish", STOP, errors)

    def post(self, final: Final) -> None:
        self.posting.add(final.job_id)
        self._pending.put_nowait(final)

    def ack(self, entry: Entry) -> None:
        self._pending.put_nowait(entry)

    @property
    def pending(self) -> int:
        """Results and acks not yet written (queued or being posted)."""
        return self._pending.qsize() + self._in_flight

    async def drained(self) -> None:
        """Returns once everything queued so far is written."""
        await self._pending.join()

    async def _post(self, finals: list[Final], stale: list[Entry]) -> None:
        """Write `finals` (and ack `stale`): retry-safe, so the caller may call it again."""
        if finals:
            outcomes = await self.queue.finish(finals)
            if already := [f.job_id for f, o in zip(finals, outcomes, strict=True) if o == 0]:
                # A duplicate delivery, or a zombie's late result: the record stays as it was
                # and nothing is published again.
                log.info(
                    "%d results not written: their jobs were already final (%s)",
                    len(already),
                    ", ".join(already[:5]),
                )
        if stale:
            await self.queue.ack(stale)

    def _take(self, first: Final | Entry) -> list[Final | Entry]:
        batch = [first]
        while not self._pending.empty():
            batch.append(self._pending.get_nowait())
        self._in_flight = len(batch)
        return batch

    def _written(self, batch: list[Final | Entry]) -> None:
        for f in batch:
            if isinstance(f, Final):
                self.posting.discard(f.job_id)
        self._in_flight = 0
        for _ in batch:
            self._pending.task_done()

    async def flush(self) -> None:
        """Write what is queued now, from the caller's task: a quiet worker's one result goes
        out without waking the run task (one hop fewer). Nothing is lost either way: if
        another write is under way, or Redis fails, `run` takes it as usual."""
        if self._in_flight or self._pending.empty():
            return
        batch = self._take(self._pending.get_nowait())
        try:
            await self._post(
                [f for f in batch if isinstance(f, Final)],
                [e for e in batch if isinstance(e, Entry)],
            )
        except QueueUnavailable:
            self._in_flight = 0
            for item in batch:  # back in line: `run` retries them with backoff
                self._pending.put_nowait(item)
                self._pending.task_done()
            return
        self._written(batch)

    async def run(self) -> None:
        """Write what is queued, in order, until cancelled."""
        await self._supervisor.run(self._post_next)

    async def _post_next(self) -> None:
        """Write the batch taken before (a retry) or wait for the next one and write it."""
        if self._taken is None:
            self._taken = self._take(await self._pending.get())
        batch = self._taken
        try:
            await self._post(
                [f for f in batch if isinstance(f, Final)],
                [e for e in batch if isinstance(e, Entry)],
            )
        except QueueUnavailable:  # kept: posted when Redis answers again
            if self.unavailable_since is None:
                self.unavailable_since = asyncio.get_running_loop().time()
            raise
        self._taken = None
        self.unavailable_since = None
        self._written(batch)
