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


def fair_order(batches: list[tuple[str, str]], running: dict[str, int] | None = None) -> list[str]:
    """Batch ids to try for free slots, fairest first: each next one is the oldest id of the
    tenant with the fewest batches running here (counting `running`, then those picked
    before it). A tenant with dozens of 24 h batches gets no more slots than one with a
    single batch while that one waits. Pure: tested alone."""
    by_tenant: dict[str, list[str]] = {}
    for batch_id, tenant in sorted(batches, reverse=True):
        by_tenant.setdefault(tenant, []).append(batch_id)  # oldest id last: popped first
    load = {t: (running or {}).get(t, 0) for t in by_tenant}
    order = []
    while by_tenant:
        tenant = min(by_tenant, key=lambda t: (load[t], t))
        order.append(by_tenant[tenant].pop())
        load[tenant] += 1
        if not by_tenant[tenant]:
            del by_tenant[tenant]
    return order


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

    def _failed(self, loop: str, e: Exception) -> None:
        """A background loop survived `e`: counted, and logged (a traceback for a bug)."""
        self.metrics.background_errors.labels(loop=loop).inc()
        if isinstance(e, QueueUnavailable):
            log.warning("%s: %s", loop, e)
        else:
            log.error("%s failed; backing off", loop, exc_info=e)

    async def _scanner(self) -> None:
        delays = Backoff()
        while True:
            try:
                await self._take()
                delays.reset()
            except Exception as e:  # the loop's boundary: any Redis refusal or bug, not death
                self._failed("batch_leases", e)
                await asyncio.sleep(delays.next())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._scan.wait(), SCAN_S)
            self._scan.clear()

    async def _take(self) -> None:
        active = await self.store.active_with_tenants()
        running: dict[str, int] = {}
        for batch_id, tenant in active:
            if batch_id in self._held:
                running[tenant] = running.get(tenant, 0) + 1
        waiting = [(b, t) for b, t in active if b not in self._held]
        for batch_id in fair_order(waiting, running):
            if len(self._held) >= MAX_BATCHES:
                return
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
                except Exception as e:  # a Redis refusal or a bug: the lease may lapse
                    self._failed("batch_leases", e)
                    if loop.time() - renewed > LEASE_MS / 1000:
                        return  # it has lapsed: someone else may hold it now
            with contextlib.suppress(asyncio.CancelledError):
                await work
        finally:
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
            self._held.pop(batch_id, None)
            with contextlib.suppress(Exception):  # it lapses by itself otherwise
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
            except Exception as e:  # the task's outer boundary: start over from Redis
                self._failed("batch_run", e)
                await asyncio.sleep(delays.next())
            finally:
                self._runs.pop(batch_id, None)
