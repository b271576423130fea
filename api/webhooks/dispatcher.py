"""Who delivers webhooks: a dispatcher in every API process (`Dispatcher`, started by the
app's lifespan when a signing key is set).

Why the API processes: a delivery is an HTTP call and some waiting, which is what their
event loop already does all day; workers stay on the device (and may sit where there is no
egress). Each API process is one consumer, in group `WEBHOOK_GROUP`, of every delivery
stream (`keys.webhooks(model, shard)`: one per served model and queue shard), named uniquely
(host:pid:random), so N processes share the deliveries with no setup. An entry is settled on
its own shard: every script names one shard's keys (one hash tag, one slot of a cluster).

Where a delivery can be when a process dies, and what happens then. Delivery is at least
once, and a repeat carries the same `X-Inferq-Delivery`:

| where it is                               | after a crash                                          |
|-------------------------------------------|--------------------------------------------------------|
| in the stream, not read yet               | read by any live process                               |
| read (in the dead consumer's pending list), | taken over (XAUTOCLAIM) by any process once idle for |
| before, during or after its POST          | `claim_idle_ms` (twice the most an attempt takes), and |
|                                           | attempted again: the receiver may see it twice         |
| being settled                             | SETTLE is one script: checks the entry is still this   |
|                                           | consumer's, then writes the retry record or dead letter |
|                                           | and XACK+XDEL together, or nothing                     |
| in the retry zset                         | owned by nobody: any process's promoter moves it back  |
|                                           | (PROMOTE: ZREM+XADD in one script, never twice)        |

A process takes over from the whole group, itself included: a reply lost on a dropped
connection leaves entries in its own pending list, which its `>` reads never return.
Take-overs are counted by Redis (the entry's delivery count); past `delivery.MAX_DELIVERIES`
the entry is dead-lettered unattempted, so a delivery that kills its deliverer cannot kill
them all.

Fairness: at most `INFERQ_WEBHOOK_CONCURRENCY` entries are held (and attempted) at once per
process, and at most `INFERQ_WEBHOOK_PER_TARGET` of them per target, whose circuit breaker
stops attempts to a target that keeps failing (`webhooks.targets`). An entry whose target
cannot take it now is deferred, not waited for, so a tarpit holds a few slots, not all.

Both loops outlive every error (`inferq.shared.supervise`, policy SURVIVE): each is counted
in `inferq_background_errors_total{loop="webhooks_read"|"webhooks_upkeep"}`, logged once per
streak, and followed by a backoff.

What happens to one entry is `webhooks.delivery.Deliverer`; the scripts and the plain
stream calls live in `webhooks.store`; one attempt (the POST) in `webhooks.poster.Poster`,
what its answer means in `webhooks.contract`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from inferq.api.webhooks.contract import attempt_budget_s, enabled
from inferq.api.webhooks.delivery import Deliverer, Pace
from inferq.api.webhooks.poster import Poster
from inferq.api.webhooks.store import (
    BLOCK_MS,
    Entry,
    Reader,
    Scripts,
    Shard,
    autoclaim,
    ensure_group,
    shards_of,
)
from inferq.shared import keys
from inferq.shared.errors import QueueUnavailable
from inferq.shared.metrics import ApiMetrics
from inferq.shared.producer import JobProducer
from inferq.shared.redis_conn import as_str, unavailable
from inferq.shared.settings import Settings
from inferq.shared.supervise import SURVIVE, Supervisor

log = logging.getLogger("inferq.api.webhooks")

READ_MAX = 64  # entries per read, and per take-over pass
PROMOTE_MAX = 100  # retries moved back per script call (keeps each call short)
MAX_TICK_S = 1.0  # the upkeep loop wakes at least this often
FORGET_AFTER_MS = 3_600_000  # a consumer idle this long and holding nothing is removed
FORGET_EVERY_S = 300.0
STOP_GRACE_S = 5.0  # at shutdown, in-flight attempts get this long, then are left pending


def claim_idle_ms(settings: Settings) -> int:
    """An entry pending this long is a dead (or wedged) process's: twice the most an attempt
    takes, so a live attempt is never taken over from under itself."""
    return int(2 * attempt_budget_s(settings) * 1000)


class Dispatcher:
    """Reads deliveries and takes over stale ones, attempts them (at most
    `webhook_concurrency` at once, `webhook_per_target` per target), settles each; promotes
    due retries. Two tasks: `read` and `upkeep`."""

    def __init__(
        self,
        settings: Settings,
        queue: JobProducer,
        blocking: Redis,
        metrics: ApiMetrics,
        *,
        poster: Poster | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.redis = queue.redis
        self.blocking = blocking  # XREADGROUP BLOCK only: never a pooled request connection
        self.metrics = metrics
        self.poster = poster or Poster(settings)
        self.consumer = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._clock = clock or time.monotonic
        self.claim_idle_ms = claim_idle_ms(settings)
        self._claim_every_s = min(MAX_TICK_S, max(0.05, self.claim_idle_ms / 4000))
        self._slots = asyncio.Semaphore(settings.webhook_concurrency)
        self.shards = shards_of(settings.served_models, settings.stream_shards)
        self.reader = Reader(blocking, self.shards, self.consumer)
        self.scripts = Scripts(self.redis)
        self.deliverer = Deliverer(
            settings,
            queue,
            self.scripts,
            self.consumer,
            metrics,
            self.poster,
            Pace(scheduled=self._scheduled, clock=self._clock),
        )
        self._loops: list[asyncio.Task[None]] = []
        self._inflight: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()  # a retry is due before the promoter's next pass
        self._promote_at = 0.0  # when the promoter's next pass is (by `_clock`)
        self._next_forget = 0.0  # when the upkeep next forgets idle consumers (by `_clock`)
        self._next_claim = 0.0  # when the read loop next takes over stale entries (loop time)
        self._grouped = False  # the read loop has made sure the group exists
        self._stopping = False

    @classmethod
    def launch(
        cls,
        settings: Settings,
        queue: JobProducer,
        metrics: ApiMetrics,
        blocking: Callable[[], Redis],
    ) -> Dispatcher | None:
        """A started dispatcher, or None when no signing key is set (no job can carry a
        webhook then, since submit refuses them)."""
        if not enabled(settings):
            return None
        dispatcher = cls(settings, queue, blocking(), metrics)
        dispatcher.start()
        return dispatcher

    def start(self) -> None:
        errors, running = self.metrics.background_errors, self._running
        reads = Supervisor("webhooks_read", SURVIVE, errors)
        # A failed upkeep pass waits as a pass does: a retry falling due sooner wakes it.
        upkeep = Supervisor("webhooks_upkeep", SURVIVE, errors, sleep=self._nap)
        self._next_forget = self._clock() + FORGET_EVERY_S
        self._loops = [
            asyncio.create_task(reads.run(self._read_once, running), name="webhooks-read"),
            asyncio.create_task(upkeep.run(self._upkeep_once, running), name="webhooks-upkeep"),
        ]
        for task in self._loops:
            task.add_done_callback(self._loop_ended)
        log.info("webhooks: delivering as consumer %s", self.consumer)

    async def stop(self) -> None:
        """Stop reading, give in-flight attempts `STOP_GRACE_S`, leave the rest pending
        (another process takes them over), close the connections."""
        # Each loop also checks `_stopping` (and a blocked read returns within BLOCK_MS), so
        # a cancellation swallowed inside a client library cannot hang the shutdown.
        self._stopping = True
        for task in self._loops:
            task.cancel()
        if self._loops:
            await asyncio.wait(self._loops, timeout=BLOCK_MS / 1000 + STOP_GRACE_S)
        late: set[asyncio.Task[None]] = set()
        if self._inflight:
            _, late = await asyncio.wait(set(self._inflight), timeout=STOP_GRACE_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self.poster.aclose()
        await self.blocking.aclose()
        log.info("webhooks stopped: consumer=%s left_pending=%d", self.consumer, len(late))

    # --- slots: the dispatcher never holds more entries than it can attempt now ---

    async def _take_slots(self) -> int:
        """Wait for one free slot, then take every other free one (up to READ_MAX)."""
        await self._slots.acquire()
        n = 1
        while n < READ_MAX and not self._slots.locked():
            await self._slots.acquire()
            n += 1
        return n

    def _give_slots(self, n: int) -> None:
        for _ in range(n):
            self._slots.release()

    def _spawn(self, shard: Shard, entry: Entry, times: int = 1, slot: bool = True) -> None:
        task = asyncio.create_task(self._deliver(shard, entry, times, slot))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    # --- the read loop ---

    @unavailable
    async def _read(self, n: int) -> list[tuple[Shard, Entry]]:
        try:
            return await self.reader.read(n)
        except ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            await ensure_group(self.redis, self.shards)  # flushed or evicted; read again
            return []

    def _running(self) -> bool:
        return not self._stopping

    async def _read_once(self) -> None:
        """One pass of the read loop: take free slots; fill them with stale entries
        (take-over, when due) and then with new ones. Holding the slots while blocked is what
        bounds in-flight entries; those left unfilled are given back, failure or not."""
        clock = asyncio.get_running_loop().time
        n = await self._take_slots()
        try:
            if not self._grouped:
                await ensure_group(self.redis, self.shards)
                self._grouped = True
            if clock() >= self._next_claim:
                self._next_claim = clock() + self._claim_every_s
                n -= await self._take_over(n)
            if n:
                for shard, entry in await self._read(n):
                    # One past the slots taken (see `Reader.read`) runs without a slot
                    # rather than wait for one while pending: waiting risks a take-over.
                    self._spawn(shard, entry, slot=n > 0)
                    n = max(0, n - 1)
        except Exception as e:  # its supervisor counts it and backs off
            if "NOGROUP" in str(e):
                self._grouped = False  # flushed: create it again
            raise
        finally:
            self._give_slots(n)

    async def _take_over(self, n: int) -> int:
        """Start up to `n` stale entries (a dead or wedged process's); how many it started."""
        taken = await autoclaim(self.redis, self.shards, self.consumer, self.claim_idle_ms, n)
        if taken:
            log.info("webhooks: took over %d stale deliveries", len(taken))
        for shard, entry, times in taken:
            self._spawn(shard, entry, times)
        return len(taken)

    # --- the upkeep loop: promote due retries, forget consumers of long-gone processes ---

    @unavailable
    async def _promote_due(self) -> float:
        """Seconds until the next retry is due on any shard (at most MAX_TICK_S). One script
        call per shard, never pipelined: a cluster pipeline refuses scripts."""
        wait_s = MAX_TICK_S
        for shard in self.shards:
            moved, next_ms = await self.scripts.promote(shard, PROMOTE_MAX)
            if moved >= PROMOTE_MAX:
                wait_s = 0.0
            elif next_ms >= 0:
                wait_s = min(wait_s, next_ms / 1000)
        return wait_s

    @unavailable
    async def _forget_idle_consumers(self) -> None:
        """Each API start adds a consumer name; remove those of long-gone processes."""
        for shard in self.shards:
            for c in await self.redis.xinfo_consumers(shard.stream, keys.WEBHOOK_GROUP):
                name = as_str(c["name"])
                if (
                    name != self.consumer
                    and int(c["pending"]) == 0
                    and int(c["idle"]) > FORGET_AFTER_MS
                ):
                    await self.scripts.forget(shard, name)

    async def _upkeep_once(self) -> None:
        """One pass of the upkeep loop, then its wait. A failure (NOGROUP too: the read loop
        recreates the group) goes to its supervisor, which waits its backoff with `_nap`."""
        clock = self._clock
        # While promoting, a retry due within a tick may be missed by this pass: it wakes
        # us again. One due later is seen by the next pass, at most a tick from now.
        self._promote_at = clock() + MAX_TICK_S
        self._wake.clear()
        wait_s = await self._promote_due()
        if clock() >= self._next_forget:
            await self._forget_idle_consumers()
            self._next_forget = clock() + FORGET_EVERY_S
        self.deliverer.targets.sweep(clock())
        await self._nap(wait_s)

    async def _nap(self, wait_s: float) -> None:
        """Wait `wait_s` (at least 5 ms), or less if a retry falls due sooner (`_scheduled`)."""
        wait_s = max(wait_s, 0.005)
        self._promote_at = self._clock() + wait_s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self._wake.wait()

    # --- one delivery (what happens to it: `webhooks.delivery`) ---

    async def _deliver(self, shard: Shard, entry: Entry, times: int, slot: bool) -> None:
        """The task of one entry; it holds one slot (when given one) until it is settled."""
        try:
            await self.deliverer.handle(shard, entry, times)
        except QueueUnavailable as e:
            log.warning("webhook entry %s left for take-over: %s", entry[0], e)
        except Exception:  # the task's boundary: the entry stays pending, take-over counts it
            log.exception("webhook entry %s failed; left for take-over", entry[0])
        finally:
            if slot:
                self._slots.release()

    def _scheduled(self, delay_ms: int) -> None:
        """A retry or deferral is due in `delay_ms`: wake the promoter if it would sleep past
        that (not on every one: hundreds of deferrals a second must not spin the upkeep)."""
        if self._clock() + delay_ms / 1000 < self._promote_at:
            self._wake.set()

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """Loops end only at `stop`; say so loudly if one ever ends otherwise."""
        if not self._stopping:
            error = None if task.cancelled() else task.exception()
            log.error("webhooks: loop %s ended before stop", task.get_name(), exc_info=error)
