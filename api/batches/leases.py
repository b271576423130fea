"""Which batches this process runs: every API process has one `BatchLeases`; each active
batch is run by one of them, the one holding its lease.

`BatchLeases` looks at `keys.BATCHES_ACTIVE` every `SCAN_S` (and at once when a batch is
created or cancelled in this process) and takes the batches it can hold a lease on
(`SET NX PX`, `LEASE_MS`, renewed every `RENEW_S` only while it is still ours). A process
that dies stops renewing; another takes the batch over once the lease lapses. While the
lease is held the batch runs as a `BatchRun` (`inferq.api.batches.run`: the in-flight window,
results, cancel and expiry, finalize).

Why nothing is lost or doubled when a process dies at any point:

- A line's job is submitted under the idempotency key `batch:<batch id>:<line>`, so a new
  holder that submits the line again gets the same job back, running or finished, instead
  of a second one. If that job's record has already expired (nobody held the batch for
  longer than `INFERQ_RESULT_TTL_S`), the line runs again under the next key (`…:<line>:1`):
  executed at least once, recorded exactly once.
- A line is recorded with HSETNX, and the counts move in the same script; the files are
  built from the results hash in line order, under ids derived from the batch id. So a
  finalize re-run after a crash writes the same files, and two holders racing (a paused
  process whose lease lapsed) write the same bytes and count each line once.
- The final status is set once (`lua.batches.BATCH_END` does nothing to an ended batch).
  The batch then leaves `keys.BATCHES_ACTIVE` in a step of its own (another cluster slot):
  if its holder dies in between, the next process to take the lease finds the record final
  and drops it then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket

from inferq.api.batches.files import FileStore
from inferq.api.batches.run import BatchRun, Gone
from inferq.api.batches.store import BatchStore
from inferq.api.core.service import JobService
from inferq.shared.errors import QueueUnavailable
from inferq.shared.metrics import ApiMetrics
from inferq.shared.retry import Backoff

log = logging.getLogger("inferq.api.batches")

LEASE_MS = 6_000  # how long a dead process's batches wait before another takes them
RENEW_S = 1.5  # a quarter of the lease: three renewals in a row may fail before it lapses
SCAN_S = 1.0  # how often a process looks for batches nobody holds
MAX_BATCHES = 4  # batches one process runs at once: each holds its input file in memory


class BatchLeases:
    """Finds active batches, holds their leases, runs each as a `BatchRun`."""

    def __init__(
        self, store: BatchStore, files: FileStore, jobs: JobService, metrics: ApiMetrics
    ) -> None:
        self.store = store
        self.files = files
        self.jobs = jobs
        self.metrics = metrics
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._held: dict[str, asyncio.Task[None]] = {}
        self._runs: dict[str, BatchRun] = {}
        self._scan = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._scanner(), name="batch-leases")

    async def stop(self) -> None:
        """Stop running batches and hand their leases back: another process takes them at
        once, and finds every job this one submitted under its idempotency key."""
        tasks = [t for t in (self._task, *self._held.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    def poke(self, batch_id: str | None = None) -> None:
        """A batch was created or cancelled here: look now rather than at the next scan."""
        self._scan.set()
        run = self._runs.get(batch_id or "")
        if run is not None:
            run.wake.set()

    async def _scanner(self) -> None:
        delays = Backoff()
        while True:
            try:
                await self._take()
                delays.reset()
            except QueueUnavailable as e:
                log.warning("batch leases: %s", e)
                await asyncio.sleep(delays.next())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._scan.wait(), SCAN_S)
            self._scan.clear()

    async def _take(self) -> None:
        for batch_id in await self.store.active():
            if len(self._held) >= MAX_BATCHES:
                return
            if batch_id in self._held:
                continue
            if await self.store.acquire(batch_id, self.owner, LEASE_MS):
                self._held[batch_id] = asyncio.create_task(self._hold(batch_id), name=batch_id)

    async def _hold(self, batch_id: str) -> None:
        """Run the batch while renewing its lease; stop at once if the lease is lost."""
        work = asyncio.create_task(self._work(batch_id))
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        try:
            while not work.done():
                await asyncio.wait({work}, timeout=RENEW_S)
                if work.done():
                    break
                try:
                    if not await self.store.renew(batch_id, self.owner, LEASE_MS):
                        log.warning("batch %s: lease lost; another process runs it", batch_id)
                        return
                    renewed = loop.time()
                except QueueUnavailable:
                    if loop.time() - renewed > LEASE_MS / 1000:
                        return  # it has lapsed: someone else may hold it now
            with contextlib.suppress(asyncio.CancelledError):
                await work
        finally:
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
            self._held.pop(batch_id, None)
            with contextlib.suppress(QueueUnavailable):
                await self.store.release(batch_id, self.owner)
            self._scan.set()  # there may be more to take now

    async def _work(self, batch_id: str) -> None:
        """Run the batch to its end, starting over (from what Redis holds) after a Redis
        failure; the lease stays ours meanwhile."""
        delays = Backoff()
        while True:
            try:
                rec = await self.store.load(batch_id)
                if rec is None or rec.final:
                    await self.store.deactivate(batch_id)
                    return
                run = BatchRun(rec, self.store, self.files, self.jobs, self.metrics)
                self._runs[batch_id] = run
                await run.run()  # the record is final now (FINISH)
                await self.store.deactivate(batch_id)
                return
            except Gone:
                return
            except QueueUnavailable as e:
                log.warning("batch %s: %s; starting over", batch_id, e)
                await asyncio.sleep(delays.next())
            except Exception:  # the task's outer boundary: log it, start over from Redis
                log.exception("batch %s: runner failed; starting over", batch_id)
                await asyncio.sleep(delays.next())
            finally:
                self._runs.pop(batch_id, None)
