"""Which batches this process runs: every API process has one `BatchLeases`; each active
batch is run by one of them, the one holding its lease.

`BatchLeases` looks at `keys.BATCHES_ACTIVE` every `SCAN_S` (and at once when a batch is
created or cancelled in this process) and takes the batches it can hold a lease on
(`SET NX PX`, `LEASE_MS`, renewed every `RENEW_S` only while it is still ours). A process
that dies stops renewing; another takes the batch over once the lease lapses. While the
lease is held the batch runs as a `BatchRun` (`inferq.api.batches.run`: the in-flight window,
results, cancel and expiry, finalize).

Slots are shared fairly (`fair_order`, `hand_backs`): a process runs `MAX_BATCHES` at once,
and while a tenant waits for a slot here holding fewer than its share (`MAX_BATCHES` over
the tenants running or waiting, at least one), a tenant holding more than its share hands
one back: the batch it has held longest (and at least `MIN_HOLD_S`) stops at its run's next
turn, the lease is released, and the waiting tenant's batch takes the slot; the one handed
back waits its turn again like any other. With more tenants than slots, each holds one
and the others wait for a batch to end (or another process).

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
from collections import Counter
from collections.abc import Iterable

from inferq.api.batches.files import FileStore
from inferq.api.batches.run import BatchRun, Gone
from inferq.api.batches.store import BatchStore
from inferq.api.core.service import JobService
from inferq.shared.metrics import ApiMetrics
from inferq.shared.supervise import DONE, SURVIVE, Done, Supervisor

log = logging.getLogger("inferq.api.batches")

LEASE_MS = 6_000  # how long a dead process's batches wait before another takes them
RENEW_S = 1.5  # a quarter of the lease: three renewals in a row may fail before it lapses
SCAN_S = 1.0  # how often a process looks for batches nobody holds
MAX_BATCHES = 4  # batches one process runs at once: each holds its input file in memory
# A batch taken runs at least this long before it may be handed back: each take re-reads its
# input file and submits a window of lines, which this much running pays for.
MIN_HOLD_S = 5.0


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


def hand_backs(
    held: list[tuple[str, str]], movable: set[str], waiting: Iterable[str], slots: int
) -> list[str]:
    """Batch ids to hand back so that waiting tenants get their share of `slots`.

    `held`: (batch id, tenant) of the batches run here and not already handing back, longest
    held first; `movable`: those held long enough to be handed back; `waiting`: the tenants
    of batches no process holds. A tenant's share is `slots` over the tenants held or
    waiting (at least 1). Each waiting tenant below its share gets one slot per call: a free
    one (slots not in `held`: free, or handing back), else one of the tenant holding the
    most while that one is above its share. Pure: tested alone."""
    needy = set(waiting)
    tenants = {t for _, t in held} | needy
    if not needy:
        return []
    share = max(1, slots // len(tenants))
    load = Counter(t for _, t in held)
    free = slots - len(held)
    out: list[str] = []
    for tenant in sorted(needy, key=lambda t: (load[t], t)):
        if load[tenant] >= share:
            continue
        if free > 0:
            free -= 1
        else:
            richest = max(load, key=lambda t: (load[t], t))
            if load[richest] <= share:
                break
            victim = next((b for b, t in held if t == richest and b in movable), None)
            if victim is None:
                continue  # the richest's batches are all new here: next scan
            movable.discard(victim)
            out.append(victim)
            load[richest] -= 1
        load[tenant] += 1
    return out


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
        self._taken: dict[str, float] = {}  # batch id → loop time its lease was taken
        self._yielding: set[str] = set()  # asked to hand back, not yet released
        self._runs: dict[str, BatchRun] = {}
        self._scan = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._scan.set()  # the first scan at once, not after SCAN_S
        scanner = Supervisor("batch_leases", SURVIVE, self.metrics.background_errors)
        self._task = asyncio.create_task(scanner.run(self._scan_once), name="batch-leases")

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

    async def _scan_once(self) -> None:
        """One pass of the scanner: wait for a poke (or SCAN_S), then take what we can. Its
        supervisor survives any Redis refusal or bug, backs off, and scans again."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SCAN_S):
                await self._scan.wait()
        self._scan.clear()
        await self._take()

    async def _take(self) -> None:
        active = await self.store.active_with_tenants()
        running: dict[str, int] = {}
        for batch_id, tenant in active:
            if batch_id in self._held:
                running[tenant] = running.get(tenant, 0) + 1
        waiting = [(b, t) for b, t in active if b not in self._held]
        if waiting and len(self._held) >= MAX_BATCHES:
            await self._share(active, waiting)
        for batch_id in fair_order(waiting, running):
            if len(self._held) >= MAX_BATCHES:
                return
            if await self.store.acquire(batch_id, self.owner, LEASE_MS):
                self._taken[batch_id] = asyncio.get_running_loop().time()
                self._held[batch_id] = asyncio.create_task(self._hold(batch_id), name=batch_id)

    async def _share(self, active: list[tuple[str, str]], waiting: list[tuple[str, str]]) -> None:
        """Every slot is held: ask runs of tenants above their share to hand back, for the
        tenants waiting with no process holding their batch (`hand_backs`)."""
        free = await self.store.unleased([b for b, _ in waiting])
        needy = [t for b, t in waiting if b in free]
        if not needy:
            return
        tenant_of = dict(active)
        now = asyncio.get_running_loop().time()
        held = sorted(
            ((b, tenant_of[b]) for b in self._held if b in tenant_of and b not in self._yielding),
            key=lambda bt: self._taken.get(bt[0], now),
        )
        movable = {
            b for b, _ in held if b in self._runs and now - self._taken.get(b, now) >= MIN_HOLD_S
        }
        for batch_id in hand_backs(held, movable, needy, MAX_BATCHES):
            log.info("batch %s: handing its slot back to a waiting tenant", batch_id)
            self._yielding.add(batch_id)
            self._runs[batch_id].hand_back()

    async def _hold(self, batch_id: str) -> None:
        """Run the batch while renewing its lease; stop at once if the lease is lost."""
        work = asyncio.create_task(self._work(batch_id))
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        # Renewals pace themselves (every RENEW_S): only counted and logged here.
        renewals = Supervisor("batch_leases", SURVIVE, self.metrics.background_errors)
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
                    renewals.succeeded()
                except Exception as e:  # a Redis refusal or a bug: the lease may lapse
                    renewals.failed(e)
                    if loop.time() - renewed > LEASE_MS / 1000:
                        return  # it has lapsed: someone else may hold it now
            with contextlib.suppress(asyncio.CancelledError):
                await work
        finally:
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
            self._held.pop(batch_id, None)
            self._taken.pop(batch_id, None)
            self._yielding.discard(batch_id)
            with contextlib.suppress(Exception):  # it lapses by itself otherwise
                await self.store.release(batch_id, self.owner)
            self._scan.set()  # there may be more to take now

    async def _work(self, batch_id: str) -> None:
        """Run the batch to its end, starting over (from what Redis holds) after a Redis
        failure or a bug; the lease stays ours meanwhile."""
        runs = Supervisor("batch_run", SURVIVE, self.metrics.background_errors)
        await runs.run(lambda: self._run_once(batch_id))

    async def _run_once(self, batch_id: str) -> Done:
        """One run of the batch from what Redis holds, to its end (`DONE`) or a failure."""
        try:
            rec = await self.store.load(batch_id)
            if rec is None or rec.final:
                await self.store.deactivate(batch_id)
                return DONE
            run = BatchRun(rec, self.store, self.files, self.jobs, self.metrics)
            self._runs[batch_id] = run
            await run.run()  # the record is final now (FINISH)
            await self.store.deactivate(batch_id)
            return DONE
        except Gone:
            return DONE
        finally:
            self._runs.pop(batch_id, None)
