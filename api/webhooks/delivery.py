"""What happens to one webhook stream entry, from read to settled (`Deliverer`; the
dispatcher hands it every entry it reads or takes over):

1. the delivery: the record of a retry (`{delivery}`); for a first attempt, built from the
   final record the entry carries (`{job, record}`, what FINISH and CACHED write), so it
   needs no job record, however late it runs; only an entry of an older version (`{job}`
   alone) reads the job record;
2. dead-lettered unattempted when taken over too often (`MAX_DELIVERIES`);
3. its target's gate (`webhooks.targets`): attempt now, or defer (back to the retry zset
   for a while, its attempts unchanged) so the slot serves another target at once;
4. one attempt (`webhooks.poster.Poster`), then settled: delivered, retried after a
   backoff while younger than `INFERQ_WEBHOOK_MAX_AGE_S` (counted from its first attempt:
   `Delivery.first_ms`), else dead.

Each settle is one SETTLE script on the entry's shard (`webhooks.store.Scripts`). Settled
for good (delivered, dead), the tenant's counter of unsettled deliveries goes one down:
FINISH and CACHED counted it up when they queued the entry.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from inferq.api.webhooks.contract import Delivery, Outcome, attempt_budget_s, backoff_s, delivery_id
from inferq.api.webhooks.poster import Poster
from inferq.api.webhooks.store import Entry, Shard
from inferq.api.webhooks.targets import Defer, Targets, Ticket, target_of
from inferq.shared.errors import CodecError
from inferq.shared.jobs import decode_published, now_ms
from inferq.shared.metrics import ApiMetrics
from inferq.shared.producer import JobProducer
from inferq.shared.redis_conn import as_str
from inferq.shared.schema import DeliveryField
from inferq.shared.settings import Settings

log = logging.getLogger("inferq.api.webhooks")

MAX_DELIVERIES = 5  # first read + 4 take-overs, then dead-lettered unattempted
DEAD_MAXLEN = 100_000  # approximate cap on the dead-letter stream (nobody consumes it)
_JOB, _RECORD, _DELIVERY = (
    f.value.encode() for f in (DeliveryField.JOB, DeliveryField.RECORD, DeliveryField.DELIVERY)
)


@dataclass(frozen=True, slots=True)
class Held:
    """An entry this consumer holds. `tenant`: whose counter of unsettled deliveries goes
    down when it is settled for good; None for an entry nobody counted."""

    shard: Shard
    entry_id: str
    tenant: str | None = None


class Settles(Protocol):
    """What a `Deliverer` settles entries with: `store.Scripts` (a plain object in tests)."""

    async def settle(
        self,
        shard: Shard,
        consumer: str,
        entry_id: str,
        mode: str,
        *args: bytes | str | int,
        tenant: str | None = None,
    ) -> bool: ...


@dataclass(frozen=True, slots=True)
class Pace:
    """How a deliverer keeps time: `scheduled(delay_ms)` is told of every retry or deferral
    put in the retry zset (so the promoter wakes in time), `clock` reads monotonic seconds,
    `rng` jitters the backoff. Tests pass their own."""

    scheduled: Callable[[int], None] = lambda delay_ms: None
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)


class Deliverer:
    """Takes one entry to its settled state (see the module), on the time `pace` keeps."""

    def __init__(
        self,
        settings: Settings,
        queue: JobProducer,
        scripts: Settles,
        consumer: str,
        metrics: ApiMetrics,
        poster: Poster,
        pace: Pace | None = None,
    ) -> None:
        self.settings, self.queue, self.scripts = settings, queue, scripts
        self.consumer, self.metrics, self.poster = consumer, metrics, poster
        pace = pace or Pace()
        self.scheduled, self.clock, self._rng = pace.scheduled, pace.clock, pace.rng
        self.targets = Targets(
            settings.webhook_per_target,
            settings.webhook_breaker_failures,
            settings.webhook_breaker_cooldown_s,
            attempt_budget_s(settings),
            self._rng,
        )

    async def handle(self, shard: Shard, entry: Entry, times_delivered: int) -> None:
        entry_id, fields = entry
        if not fields:  # deleted while pending: nothing left to deliver
            await self._settle(Held(shard, entry_id), "done")
            return
        job_id = as_str(fields.get(_JOB, b""))
        packed, record = fields.get(_DELIVERY), fields.get(_RECORD)
        try:
            d = (
                Delivery.unpack(packed)
                if packed is not None
                else await self._first(entry_id, job_id, record)
            )
        except CodecError as e:
            await self._dead(Held(shard, entry_id), job_id, packed or b"", str(e))
            return
        if d is None:  # the job has no webhook (a hand-written entry): nothing to do
            await self._settle(Held(shard, entry_id), "done")
            return
        # FINISH and CACHED count a delivery up when they queue it with its record; an older
        # version's `{job}` entry was never counted, and one whose job is gone has no tenant.
        # (A retry record of such an entry counts down once: the counter's floor of 0 takes it.)
        counted = (packed is not None or record is not None) and bool(d.url)
        held = Held(shard, entry_id, d.tenant if counted else None)
        if not d.url:
            await self._dead(held, d.job, d.pack(), d.error)
        elif times_delivered > MAX_DELIVERIES:
            reason = (
                f"taken over {times_delivered - 1} times without an answer; not attempted again"
            )
            await self._dead(held, d.job, d.pack(), reason)
        else:
            await self._attempt(held, d)

    async def _first(self, entry_id: str, job_id: str, record: bytes | None) -> Delivery | None:
        """The first attempt's delivery, its body snapshotted here from the final record the
        entry carries (the body then travels with every retry); from the job record only for
        an entry without one (or an undecodable one)."""
        job = decode_published(record) if record is not None else None
        if job is None and job_id:
            job = await self.queue.get(job_id)
        if job is None:
            now = now_ms()
            reason = "the entry carries no final record and the job record has expired (INFERQ_RESULT_TTL_S)"
            return Delivery(delivery_id(job_id, entry_id), job_id, "", "", b"", now, now, 0, reason)
        url = (job.webhook or {}).get("url")
        return Delivery.of(job, entry_id, url) if url else None

    async def _attempt(self, held: Held, d: Delivery) -> None:
        """One attempt if the target can take it now, else a deferral."""
        ticket = self.targets.admit(target_of(d.url), self.clock())
        if isinstance(ticket, Defer):
            await self._defer(held, d, ticket)
            return
        started = time.perf_counter()
        try:
            outcome = await self.poster.attempt(d)
        except BaseException:  # cancelled (at shutdown): the ticket goes back, telling nothing
            self._release(ticket, None)
            raise
        self._release(ticket, outcome)
        self.metrics.webhook_attempt_seconds.observe(time.perf_counter() - started)
        await self._conclude(held, d, outcome)

    def _release(self, ticket: Ticket, outcome: Outcome | None) -> None:
        ok = None if outcome is None else outcome.target_ok
        change = self.targets.release(ticket, ok, self.clock())
        if change is not None:
            level = logging.WARNING if change == "open" else logging.INFO
            why = outcome.reason if outcome is not None else ""
            log.log(level, "webhook target %s: circuit %s (%s)", ticket.target, change, why)

    async def _defer(self, held: Held, d: Delivery, defer: Defer) -> None:
        """Back to the retry zset for `defer.delay_s`, no attempt counted; dead when the
        delivery is past its age (a target open that long is not coming back for it)."""
        now, deadline = now_ms(), d.deadline_ms(self.settings.webhook_max_age_s)
        if now >= deadline:
            last = f"{d.error}; " if d.error else ""
            reason = self._gave_up(d.attempts, f"{last}target {defer.target} {defer.reason}")
            await self._dead(held, d.job, d.pack(), reason)
            return
        delay_ms = max(1, min(int(defer.delay_s * 1000), deadline - now))
        if await self._settle(held, "retry", delay_ms, d.pack()):
            self.scheduled(delay_ms)
            self.metrics.webhook_deferrals.labels(why=defer.why).inc()
            log.debug("webhook %s deferred %d ms: %s %s", d.id, delay_ms, defer.target, defer.why)

    async def _conclude(self, held: Held, d: Delivery, outcome: Outcome) -> None:
        if outcome.kind == "delivered":
            if await self._settle(held, "done"):
                self.metrics.webhook_deliveries.labels(outcome="delivered").inc()
                log.debug("webhook %s of job %s delivered (%s)", d.id, d.job, outcome.reason)
            return
        failed = d.failed(outcome.reason)
        if outcome.kind == "dead":
            await self._dead(held, d.job, failed.pack(), outcome.reason)
            return
        now, deadline = now_ms(), d.deadline_ms(self.settings.webhook_max_age_s)
        if now >= deadline:
            reason = self._gave_up(failed.attempts, outcome.reason)
            await self._dead(held, d.job, failed.pack(), reason)
            return
        cap = self.settings.webhook_backoff_max_s
        delay = backoff_s(failed.attempts, self.settings.webhook_backoff_s, cap, self._rng)
        if outcome.retry_after_s is not None:  # the receiver asked for longer: up to the cap
            delay = max(delay, min(outcome.retry_after_s, cap))
        delay_ms = max(1, min(int(delay * 1000), deadline - now))  # one last try at the deadline
        if await self._settle(held, "retry", delay_ms, failed.pack()):
            self.metrics.webhook_deliveries.labels(outcome="retried").inc()
            self.scheduled(delay_ms)
            log.info(
                "webhook %s of job %s: attempt %d failed (%s), next in %d ms",
                d.id,
                d.job,
                failed.attempts,
                outcome.reason,
                delay_ms,
            )

    def _gave_up(self, attempts: int, last: str) -> str:
        max_age_s = self.settings.webhook_max_age_s
        return (
            f"gave up after {attempts} attempts over INFERQ_WEBHOOK_MAX_AGE_S={max_age_s:g}: {last}"
        )

    async def _dead(self, held: Held, job_id: str, record: bytes, reason: str) -> None:
        if await self._settle(held, "dead", DEAD_MAXLEN, job_id, record, reason):
            self.metrics.webhook_deliveries.labels(outcome="dead").inc()
            log.warning("webhook of job %s dead-lettered: %s", job_id, reason)

    async def _settle(self, held: Held, mode: str, *args: bytes | str | int) -> bool:
        return await self.scripts.settle(
            held.shard, self.consumer, held.entry_id, mode, *args, tenant=held.tenant
        )
