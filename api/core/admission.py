"""Admission: whether new work may come in, and what a refused client is told. Three checks,
in the order a submit meets them and this module holds them:

**The model** (`ModelCatalog`): served here, and taking these inputs as its workers declared
them in Redis; with how fast its workers go. Each is read at most every few seconds per
process, by one request at a time: the requests that find it stale while it is being read
wait for that read (at 512 clients, each request arriving during one read's round trip used
to read it again: ~14 % of the API's CPU).

**The queue's room** (`Admission`). Pure: no Redis, no clock. The numbers come in (items
queued, the workers' recent items/s, the job's deadline); a limit or a refusal goes out. The
Redis side (`scripts.SUBMIT`) applies the limit atomically per shard. Invariants:

* `limit` never admits fewer than the job's own items when workers are live (rate > 0): a
  job alone in an empty queue is never refused for being slow; it never exceeds
  `max_queue`. With a rate, it is what the workers finish before the deadline (rate ×
  timeout), so an admitted job can finish in time.
* Every refusal carries `retry_after_s >= 1` and a `reason` from a fixed set
  (`REASONS`): metrics label it, clients read it.
* `retry_after_s` is the time for enough of the queue ahead to drain that this job fits;
  without a rate it is an estimate at 100 items/s, and for bytes the job's own run time.

**Redis's room** (`RedisMemory`). Redis runs with `maxmemory` and `noeviction` (it refuses
writes when full rather than drop a job); the API refuses new work a little before that, at
`INFERQ_REDIS_MEMORY_HIGH_WATER` of maxmemory, with 503 + Retry-After, so that what was
accepted can still be finished, published and acknowledged (a Redis without maxmemory is
never full here). `INFO memory` is read at most every `MEMORY_TTL_S` per process, one
reading at a time; between readings the guard counts what this process has `reserved`
(admitted, not yet written) and `written` since. The decision and the reservation happen
with no await between them, so 30 requests arriving together are each judged against those
admitted before them, never all against one stale figure (check-then-act: 30 x 4.9 MB once
ran a 128 MiB Redis to 150 % of maxmemory). A write Redis itself refuses for memory (OOM
under noeviction: another process filled it) leaves `admit` as this guard's `RedisFull`
(503 + Retry-After), not as "unreachable", and every refused write is remembered for
`/readyz` (`refusing`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from inferq.api.core.errors import out_of_memory, write_refusal
from inferq.shared.errors import (
    InputInvalid,
    ModelNotServed,
    Overloaded,
    QueueUnavailable,
    RedisFull,
)
from inferq.shared.jobs import now_ms
from inferq.shared.metrics import ApiMetrics
from inferq.shared.redis_conn import unavailable
from inferq.shared.registry import ModelInfo, WorkerRegistry
from inferq.shared.schema import InputKind
from inferq.shared.settings import Settings

log = logging.getLogger("inferq.api")

# Worker throughput and model declarations are read from Redis at most this often per model.
THROUGHPUT_TTL_S = 1.0
INFO_TTL_S = 5.0

T = TypeVar("T")


class ModelCatalog:
    def __init__(self, settings: Settings, registry: WorkerRegistry) -> None:
        self.default = settings.default_model.name
        self.names = settings.served_models
        self.registry = registry
        self._throughput: dict[str, tuple[float, float]] = {}  # model → (read at, items/s)
        self._info: dict[str, tuple[float, ModelInfo | None]] = {}  # model → (read at, info)
        self._reading: dict[str, asyncio.Future[Any]] = {}  # key → the read under way

    def resolve(self, requested: str | None) -> str:
        """The served model a request names (the default when it names none); 404 if the
        name is not served here (the message shows at most 64 of its characters)."""
        name = requested or self.default
        if name not in self.names:
            served = ", ".join(sorted(self.names))
            raise ModelNotServed(f"model {name[:64]!r} is not served here; served: {served}")
        return name

    async def _read_once(self, key: str, read: Callable[[], Awaitable[T]]) -> T:
        """One read per key at a time: a caller that comes while one runs awaits that one."""
        running = self._reading.get(key)
        if running is None:
            running = self._reading[key] = asyncio.ensure_future(read())
            running.add_done_callback(lambda _, k=key: self._reading.pop(k, None))  # type: ignore[misc]
        # Shielded: a caller that leaves (its client gone) does not cancel the others' read.
        return await asyncio.shield(running)  # type: ignore[no-any-return]

    async def throughput(self, model: str) -> float:
        """Recent items/s of the model's live workers (cached briefly per process)."""
        now = time.monotonic()
        cached = self._throughput.get(model)
        if cached is not None and now - cached[0] < THROUGHPUT_TTL_S:
            return cached[1]
        value = await self._read_once(
            f"throughput:{model}", lambda: self.registry.throughput(model, now_ms())
        )
        self._throughput[model] = (now, value)
        return value

    async def info(self, model: str) -> ModelInfo | None:
        """What `model` takes, as its workers declared it (None until one has started)."""
        now = time.monotonic()
        cached = self._info.get(model)
        if cached is not None and now - cached[0] < INFO_TTL_S:
            return cached[1]
        info = await self._read_once(f"info:{model}", lambda: self.registry.model_info(model))
        if info is not None:  # not yet declared: look again next time, not in INFO_TTL_S
            self._info[model] = (now, info)
        return info

    async def check(self, model: str, kinds: list[InputKind], parameters: dict[str, Any]) -> None:
        """Inputs of a kind the model does not take, or parameters it does not know → 422."""
        info = await self.info(model)
        if info is None:
            return  # no worker has declared it yet: the worker checks (invalid_input)
        for i, kind in enumerate(kinds):
            if kind not in info.inputs:
                raise InputInvalid(
                    f"input {i} is {kind}, but model {model!r} takes {', '.join(info.inputs)}"
                )
        if unknown := sorted(set(parameters) - set(info.parameters)):
            takes = ", ".join(sorted(info.parameters)) or "none"
            shown = [u[:64] for u in unknown[:8]]
            raise InputInvalid(f"unknown parameters {shown} for model {model!r}; it takes: {takes}")


# --- The queue's room ---

#: Why a submit was refused (the label of `inferq_jobs_rejected_total{reason}`).
REASONS = (
    "queue_full",
    "queue_bytes",
    "deadline",
    "tenant_queue_full",
    "tenant_queue_bytes",
    "tenant_webhooks",
)
#: Drain rate assumed for Retry-After while no worker has reported one yet (items/s).
UNKNOWN_RATE = 100
#: Retry-After of a refusal for the tenant's webhook backlog: deliveries drain at the pace of
#: a target coming back, not of the queue.
WEBHOOK_RETRY_S = 30


@dataclass(frozen=True, slots=True)
class Admission:
    max_queue: int  # items queued per model (INFERQ_MAX_QUEUE)
    max_queue_bytes: int  # input bytes queued per model (INFERQ_MAX_QUEUE_BYTES)
    tenant_share: float = 1.0  # of both, per tenant (INFERQ_TENANT_QUEUE_SHARE); 1: uncapped
    max_webhooks: int = 0  # unsettled deliveries per tenant (INFERQ_TENANT_MAX_WEBHOOKS)

    def tenant_caps(self) -> tuple[int, int]:
        """(items, bytes) one tenant may hold per model; (0, 0) when tenants are not capped."""
        if self.tenant_share >= 1:
            return 0, 0
        share = self.tenant_share
        return max(1, int(self.max_queue * share)), max(1, int(self.max_queue_bytes * share))

    def tenant_refusal(
        self, outcome: str, tenant: str, model: str, held: int, items: int, rate: float
    ) -> Overloaded:
        """The refusal when `tenant` already holds `held` items (`tenant_full`) or bytes
        (`tenant_bytes`) of `model`'s queue, its share of it."""
        cap_items, cap_bytes = self.tenant_caps()
        retry = max(1, math.ceil(items / rate)) if rate > 0 else 1
        share = f"INFERQ_TENANT_QUEUE_SHARE={self.tenant_share:g}"
        if outcome == "tenant_bytes":
            return Overloaded(
                f"tenant {tenant!r} holds {held} input bytes of model {model!r}'s queue "
                f"(its cap: {cap_bytes}, {share} of INFERQ_MAX_QUEUE_BYTES)",
                retry,
                "tenant_queue_bytes",
            )
        return Overloaded(
            f"tenant {tenant!r} has {held} items queued for model {model!r} "
            f"(its cap: {cap_items}, {share} of INFERQ_MAX_QUEUE)",
            retry,
            "tenant_queue_full",
        )

    def webhook_refusal(self, tenant: str, backlog: int) -> Overloaded | None:
        """The refusal of a job with a webhook while `tenant` has `backlog` deliveries not
        yet settled, at or past its cap; None while under it."""
        if not self.max_webhooks or backlog < self.max_webhooks:
            return None
        return Overloaded(
            f"tenant {tenant!r} has {backlog} webhook deliveries not yet made "
            f"(INFERQ_TENANT_MAX_WEBHOOKS={self.max_webhooks}); is its target down?",
            WEBHOOK_RETRY_S,
            "tenant_webhooks",
        )

    def limit(self, items: int, rate: float, timeout_s: float) -> int:
        """Items the queue may hold, this job included, for the job to finish in time."""
        if rate <= 0:
            return self.max_queue
        return min(self.max_queue, max(items, int(rate * timeout_s)))

    def too_many_bytes(self, model: str, held: int, items: int, rate: float) -> Overloaded:
        """The refusal when the model's queue holds `held` input bytes, over its cap."""
        retry = max(1, math.ceil(items / rate)) if rate > 0 else 1
        return Overloaded(
            f"model {model!r} holds {held} input bytes in Redis "
            f"(INFERQ_MAX_QUEUE_BYTES={self.max_queue_bytes})",
            retry,
            "queue_bytes",
        )

    def too_many_items(
        self, model: str, depth: int, items: int, rate: float, timeout_s: float
    ) -> Overloaded:
        """The refusal when `depth` items are queued and this job's `items` do not fit under
        `limit`: the queue is full, or its wait would pass the job's deadline."""
        # Retry when enough of the queue ahead has drained for this job to fit.
        excess = depth + items - self.limit(items, rate, timeout_s)
        if rate > 0:
            retry = max(1, math.ceil(excess / rate))
        else:
            retry = max(1, math.ceil(depth / UNKNOWN_RATE))
        # Without a rate the only bound is the item cap (a pinned job meets its shard's share
        # of it, so the total may still be under `max_queue`).
        if rate <= 0 or depth + items > self.max_queue:
            return Overloaded(
                f"model {model!r} has {depth} items queued (INFERQ_MAX_QUEUE={self.max_queue})",
                retry,
                "queue_full",
            )
        return Overloaded(
            f"predicted wait {depth / rate:.1f}s ({depth} items at {rate:.0f}/s) exceeds the "
            f"job's deadline of {timeout_s:g}s",
            retry,
            "deadline",
        )


# --- Redis's room ---

MEMORY_TTL_S = 1.0  # INFO memory at most this often per process, while far from the mark
NEAR_TTL_S = 0.1  # and this often once within NEAR of it: a burst cannot run past it for long
NEAR = 0.8  # of the high-water mark
RETRY_AFTER_S = 5  # what a refused client is told: the workers drain in the meantime
# How long a write Redis refused (OOM, MISCONF, NOREPLICAS...) keeps /readyz at 503: about
# one client's Retry-After, so a balancer steers new clients away while it lasts.
REFUSAL_READY_S = 2 * RETRY_AFTER_S
# Redis holds a queued job in ~1.2x its inputs' bytes (record, stream entry, counters;
# measured: 235 KB for 200 KB of inputs); counting 1.5x errs towards reading early.
WRITE_WEIGHT = 1.5
# While it is being written, a request costs Redis more: its command sits whole in its
# connection's query buffer (counted in used_memory, and every concurrent request's buffer
# fills at once while Redis runs one command at a time), and a script copies its arguments.
# Measured with 30 concurrent 4.9 MB submits against 128 MiB: Redis peaks at ~2.5x the
# inputs admitted (108-138 % of maxmemory when they counted 1.5x; 80-92 % at 2.5x); 3x
# keeps the peak near the mark, not at maxmemory.
IN_FLIGHT_WEIGHT = 3.0
# A file is written a chunk at a time (`inferq.api.batches.files`): while written it costs
# its bytes plus one chunk's query buffer.
FILE_WEIGHT = 1.2


def memory_reading(info: Mapping[str, Any]) -> tuple[float, int]:
    """(used_memory / maxmemory, maxmemory) of one INFO memory reply, or of the fullest node
    of a cluster's (a reply per node, each with its own maxmemory); (0, 0) without one."""
    if "used_memory" not in info:  # a cluster client: {node: reply}
        nodes = [memory_reading(v) for v in info.values() if isinstance(v, Mapping)]
        return max(nodes, default=(0.0, 0))
    maxmemory = int(info.get("maxmemory", 0) or 0)
    return (int(info["used_memory"]) / maxmemory, maxmemory) if maxmemory > 0 else (0.0, 0)


def full(message: str) -> RedisFull:
    return RedisFull(message, RETRY_AFTER_S)


class Reservation:
    """Bytes one request is about to write, held against the mark until they land
    (`landed`: counted as written until the next reading) or are given up (`release`)."""

    def __init__(self, memory: RedisMemory, nbytes: int, weight: float) -> None:
        self.memory = memory
        self.weight = weight
        self.weighted = int(nbytes * weight)  # what `memory.reserved` holds for it
        self.open = True

    async def grow(self, nbytes: int) -> None:
        """Reserve `nbytes` more (an upload whose size shows only once read); RedisFull if
        they do not fit, the bytes already reserved staying held."""
        self.weighted += await self.memory._reserve(nbytes, self.weight)

    def landed(self) -> None:
        """Written: counted as written, at the in-flight weight, until the next reading
        (the command's query buffer outlives it by seconds: Redis shrinks idle buffers in
        its cron)."""
        if self.open:
            self.open = False
            self.memory.reserved -= self.weighted
            self.memory.written += self.weighted

    def release(self) -> None:
        if self.open:
            self.open = False
            self.memory.reserved -= self.weighted

    def close(self, exc: BaseException | None) -> None:
        """Released unless landed; a write Redis refused is remembered, and an OOM leaves
        as the guard's `RedisFull`."""
        self.release()
        if isinstance(exc, QueueUnavailable) and not isinstance(exc, RedisFull):
            self.memory.refused(exc)
            if out_of_memory(exc):  # Redis's own words stay in the log, as for any refusal
                log.warning("redis refused a write for memory: %s", exc)
                raise full(
                    "Redis is out of memory (maxmemory, noeviction): new work is refused "
                    "until the queue drains"
                ) from exc


class RedisMemory:
    def __init__(
        self,
        redis: Redis,
        high_water: float,
        metrics: ApiMetrics | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = redis
        self.high_water = high_water
        self.metrics = metrics
        self.clock = clock
        self.ratio = 0.0  # the last reading
        self.maxmemory = 0  # of the fullest node at the last reading; 0: unbounded
        self.written = 0  # weighted bytes this process has written since the last reading
        self.reserved = 0  # weighted bytes admitted here whose write has not landed yet
        self.refused_at = float("-inf")  # clock of the last write Redis refused
        self.refusal = ""  # and what it was, in our words (never Redis's: hosts, ports)
        self._read_at = float("-inf")
        self._reading: asyncio.Future[None] | None = None

    @property
    def estimate(self) -> float:
        """The last reading plus what this process has written or admitted since (a
        cluster's writes spread over its nodes: counting them all against the fullest one
        errs safe)."""
        extra = (self.written + self.reserved) / self.maxmemory if self.maxmemory else 0.0
        return self.ratio + extra

    def wrote(self, nbytes: int) -> None:
        """Count bytes this process has just written outside any reservation."""
        self.written += int(nbytes * WRITE_WEIGHT)

    def admit(self, nbytes: int, weight: float = IN_FLIGHT_WEIGHT) -> _Admit:
        """`async with memory.admit(n) as held:` reserve n bytes (RedisFull if they would
        pass the mark), write, `held.landed()` once written; released otherwise. `weight`:
        what a byte of the request costs Redis while it is written (FILE_WEIGHT for files)."""
        return _Admit(self, nbytes, weight)

    async def check(self) -> None:
        """Raise `RedisFull` (503) while Redis is past the high-water mark."""
        await self._reserve(0)

    async def _reserve(self, nbytes: int, weight: float = IN_FLIGHT_WEIGHT) -> int:
        """Reserve `nbytes` (weighted: what is returned) or raise RedisFull. The decision and
        the reservation come after the last await: nothing can be admitted in between."""
        weighted = int(nbytes * weight)
        if self.high_water == float("inf"):  # unguarded: counted all the same, never refused
            self.reserved += weighted
            return weighted
        now = self.clock()
        if self._stale(now, weighted):
            await self._refresh(now)
        if self.ratio >= self.high_water:
            raise full(
                "Redis memory is past INFERQ_REDIS_MEMORY_HIGH_WATER: new work is refused "
                "until the queue drains"
            )
        if weighted and self.maxmemory and self._past(weighted):
            raise full(
                f"Redis memory would pass INFERQ_REDIS_MEMORY_HIGH_WATER with {nbytes} more "
                "bytes (and what is being written now): new work is refused until the queue "
                "drains"
            )
        self.reserved += weighted
        return weighted

    def _past(self, weighted: int) -> bool:
        return (
            self.estimate + weighted / self.maxmemory >= self.high_water
            if self.maxmemory
            else False
        )

    def _stale(self, now: float, weighted: int) -> bool:
        estimate = self.estimate
        ttl_s = NEAR_TTL_S if estimate >= NEAR * self.high_water else MEMORY_TTL_S
        # Past the mark by the estimate alone: read now rather than refuse on a guess (the
        # workers may have drained meanwhile) or accept on a stale reading.
        return now - self._read_at >= ttl_s or (
            self.ratio < self.high_water and self._past(weighted)
        )

    async def _refresh(self, now: float) -> None:
        """One INFO reading; callers arriving while it is in flight share it."""
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._take_reading(now))
        await asyncio.shield(self._reading)

    async def _take_reading(self, now: float) -> None:
        try:
            self.ratio, self.maxmemory = await self._read()
        finally:
            self._reading = None
        # What landed before the reading is in it; what is reserved may not be yet.
        self.written = 0
        self._read_at = now
        if self.metrics is not None:
            self.metrics.redis_memory_ratio.set(self.ratio)

    def refused(self, exc: QueueUnavailable) -> None:
        """Remember a write Redis refused (OOM, MISCONF...): `/readyz` says so for a while."""
        if (why := write_refusal(exc)) is not None:
            self.refused_at = self.clock()
            self.refusal = why

    async def refusing(self) -> str | None:
        """Why new work is refused now (the mark, read afresh if stale, or a write Redis
        refused within `REFUSAL_READY_S`), or None. Raises QueueUnavailable if Redis is down."""
        try:
            await self.check()
        except RedisFull:
            return "redis memory past INFERQ_REDIS_MEMORY_HIGH_WATER"
        if self.clock() - self.refused_at < REFUSAL_READY_S:
            return f"redis refused a write: {self.refusal}"
        return None

    @unavailable
    async def _read(self) -> tuple[float, int]:
        try:
            info = await self.redis.info("memory")
            if self._read_at == float("-inf"):  # the first reading: say what it cannot guard
                self._warn_unbounded(info)
            return memory_reading(info)
        except ResponseError as e:  # INFO denied (a managed Redis's ACL) or not served
            log.warning("cannot read Redis memory (%s): the high-water mark is off", e)
            self.high_water = float("inf")
            return 0.0, 0

    @staticmethod
    def _warn_unbounded(info: Mapping[str, Any]) -> None:
        if "used_memory" not in info:
            return  # a cluster: one reply per node; each node's own config is its operator's
        policy = info.get("maxmemory_policy", "")
        if not int(info.get("maxmemory", 0) or 0):
            log.warning(
                "Redis has no maxmemory: it grows until the kernel kills it, and the "
                "API's 503 before a full Redis never comes (set maxmemory + noeviction)"
            )
        elif policy != "noeviction":
            log.warning(
                "Redis evicts keys (maxmemory-policy %s): a job record or stream entry "
                "can vanish under memory pressure; use noeviction",
                policy,
            )


class _Admit:
    """`RedisMemory.admit`'s context: reserve on entry, `Reservation.close` on exit."""

    def __init__(self, memory: RedisMemory, nbytes: int, weight: float) -> None:
        self.memory = memory
        self.nbytes = nbytes
        self.weight = weight
        self.held: Reservation | None = None

    async def __aenter__(self) -> Reservation:
        await self.memory._reserve(self.nbytes, self.weight)
        self.held = Reservation(self.memory, self.nbytes, self.weight)
        return self.held

    async def __aexit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self.held is not None
        self.held.close(exc)
