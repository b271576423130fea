"""What the routes do, without HTTP: one submit(-and-wait) pipeline for every route.

`submit` resolves the model, checks the inputs against what the model takes (its workers
declare it in Redis: input kinds, parameter names), admits (items, bytes, and whether the
queue ahead can finish before the deadline), records and enqueues, and counts the job as
submitted or rejected. `run` is submit then wait, cancelling the job if the client leaves
before any worker has started it. `/v1/jobs`, `/v1/infer` and `/v1/embeddings` all come
through here, so metrics, admission, idempotency and cancel-on-disconnect are the same on all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from inferq.api.cache import ResultCache
from inferq.api.errors import request_error
from inferq.api.inputs import InputItem, wire_images, wire_inputs
from inferq.api.notifier import Notifier
from inferq.api.webhooks import submit_target
from inferq.shared import keys
from inferq.shared.errors import (
    InputInvalid,
    JobConflict,
    JobNotFound,
    ModelNotServed,
    Overloaded,
    QueueUnavailable,
    RequestError,
)
from inferq.shared.jobs import (
    ErrorCode,
    Job,
    JobError,
    Status,
    decode_outputs,
    decode_published,
    encode_final,
    encode_submit,
    new_job_id,
    now_ms,
)
from inferq.shared.metrics import ApiMetrics
from inferq.shared.queue import JobQueue, Submitted, per_shard
from inferq.shared.registry import ModelInfo, WorkerRegistry
from inferq.shared.schema import InputKind, JobField
from inferq.shared.settings import Settings

# Worker throughput and model declarations are read from Redis at most this often per model.
THROUGHPUT_TTL_S = 1.0
INFO_TTL_S = 5.0


@dataclass(slots=True)
class Submission:
    """One job as a route parsed it: JSON items or uploaded image files, not yet checked."""

    items: list[InputItem] = field(default_factory=list)
    files: list[bytes] = field(default_factory=list)
    model: str | None = None
    tenant: str = ""
    priority: str = "normal"
    timeout_s: float | None = None
    idempotency_key: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    webhook: str | None = None  # URL to deliver the final job to


class JobService:
    def __init__(
        self,
        settings: Settings,
        queue: JobQueue,
        registry: WorkerRegistry,
        notifier: Notifier,
        metrics: ApiMetrics,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.registry = registry
        self.notifier = notifier
        self.metrics = metrics
        self.cache = ResultCache(settings, queue.redis)
        self.models = settings.served_models
        self.shutting_down = False
        self._throughput: dict[str, tuple[float, float]] = {}  # model → (read at, items/s)
        self._info: dict[str, tuple[float, ModelInfo | None]] = {}  # model → (read at, info)
        self._turn = itertools.count(random.randrange(1024))  # the next unpinned job's shard

    def resolve_model(self, requested: str | None) -> str:
        name = requested or self.settings.default_model.name
        if name not in self.models:
            served = ", ".join(sorted(self.models))
            raise ModelNotServed(f"model {name!r} is not served here; served: {served}")
        return name

    async def throughput(self, model: str) -> float:
        """Recent items/s of the model's live workers (cached briefly per process)."""
        now = time.monotonic()
        cached = self._throughput.get(model)
        if cached is not None and now - cached[0] < THROUGHPUT_TTL_S:
            return cached[1]
        value = await self.registry.throughput(model, now_ms())
        self._throughput[model] = (now, value)
        return value

    async def model_info(self, model: str) -> ModelInfo | None:
        """What `model` takes, as its workers declared it (None until one has started)."""
        now = time.monotonic()
        cached = self._info.get(model)
        if cached is not None and now - cached[0] < INFO_TTL_S:
            return cached[1]
        info = await self.registry.model_info(model)
        if info is not None:  # not yet declared: look again next time, not in INFO_TTL_S
            self._info[model] = (now, info)
        return info

    async def check_model(self, model: str, sub: Submission, kinds: list[InputKind]) -> None:
        """Inputs of a kind the model does not take, or parameters it does not know → 422."""
        info = await self.model_info(model)
        if info is None:
            return  # no worker has declared it yet: the worker checks (invalid_input)
        for i, kind in enumerate(kinds):
            if kind not in info.inputs:
                raise InputInvalid(
                    f"input {i} is {kind}, but model {model!r} takes {', '.join(info.inputs)}"
                )
        if unknown := sorted(set(sub.parameters) - set(info.parameters)):
            takes = ", ".join(sorted(info.parameters)) or "none"
            raise InputInvalid(
                f"unknown parameters {unknown} for model {model!r}; it takes: {takes}"
            )

    async def submit(self, sub: Submission) -> Job:
        """Admit, record, enqueue; every accepted and every refused job is counted."""
        model = sub.model or self.settings.default_model.name
        try:
            job, created = await self._submit(sub)
        except RequestError as e:
            reason = e.reason if isinstance(e, Overloaded) else request_error(e)[1]
            self.metrics.jobs_rejected.labels(model=model, reason=reason).inc()
            raise
        if created:  # an Idempotency-Key repeat returns the first job: not a new submission
            self.metrics.jobs_submitted.labels(model=job.model).inc()
        return job

    async def _submit(self, sub: Submission) -> tuple[Job, bool]:
        name = self.resolve_model(sub.model)
        if sub.files:
            inputs, kinds = wire_images(sub.files, self.settings)
        else:
            inputs, kinds = wire_inputs(sub.items, self.settings)
        await self.check_model(name, sub, kinds)
        # 422 without a signing key or for a URL the SSRF guard refuses (resolved off-loop).
        webhook = await submit_target(self.settings, sub.tenant, sub.webhook)
        timeout_s = sub.timeout_s or self.settings.job_timeout_s
        created = now_ms()
        job = Job(
            id="", model=name, inputs=inputs, tenant=sub.tenant,
            priority=sub.priority, created_ms=created,
            deadline_ms=created + int(timeout_s * 1000), parameters=sub.parameters,
        )  # fmt: skip
        job.webhook = webhook
        key_hash = None
        if sub.idempotency_key is not None:
            key_hash = hashlib.sha256(sub.idempotency_key.encode()).hexdigest()
        digest = None
        if self.cache.enabled(name) and (info := await self.model_info(name)) and info.version:
            digest = self.cache.digest(job, info.version)
        # A repeat of an Idempotency-Key must meet its first job's key, and a cache lookup the
        # shard that filled it: those pin the shard; any other job takes the next in turn.
        pin = key_hash or digest
        shards = self.queue.shards
        first = int(pin[:8], 16) % shards if pin else next(self._turn) % shards
        job.id = new_job_id(name, first, shards)
        if digest is not None:
            key = keys.cache(digest, name, first, shards)
            hit = await self.cache.get(key)
            self.metrics.cache_lookups.labels(model=name, result="hit" if hit else "miss").inc()
            if hit is not None:
                return await self._answer_cached(job, hit, key_hash)
            job.cache = self.cache.spec(key)
        rate = await self.throughput(name)
        # Admit only what can finish in time: the queue ahead drains at `rate` items/s.
        limit = self.settings.max_queue
        if rate > 0:
            limit = min(limit, max(len(inputs), int(rate * timeout_s)))
        wait = self.settings.redis_wait_replicas
        # WAIT within three quarters of the socket timeout, so its reply always comes back.
        wait_ms = int(self.settings.redis_timeout_s * 750)
        done = await self._enqueue(job, limit, key_hash, first, pinned=pin is not None,
                                   wait=(wait, wait_ms))  # fmt: skip
        if done.replicas is not None and done.replicas < wait:
            # The job is on the master (and runs), but a failover now could lose it: refuse the
            # acknowledgement. A retry with the same Idempotency-Key finds it, and is answered
            # once the replicas have it.
            raise QueueUnavailable(
                f"job {done.job_id} reached {done.replicas} of {wait} replicas within "
                f"{wait_ms} ms (INFERQ_REDIS_WAIT_REPLICAS)"
            )
        if done.outcome == "duplicate":
            return await self.get(done.job_id, sub.tenant), False
        if done.outcome == "full_bytes":
            raise Overloaded(
                f"model {name!r} holds {done.depth} input bytes in Redis "
                f"(INFERQ_MAX_QUEUE_BYTES={self.settings.max_queue_bytes})",
                self._retry_after(len(inputs), rate),
                "queue_bytes",
            )
        if done.outcome == "full":
            self._reject(name, done.depth, len(inputs), rate, timeout_s)
        return job, True

    async def _enqueue(
        self, job: Job, limit: int, key_hash: str | None, first: int, *, pinned: bool,
        wait: tuple[int, int],
    ) -> Submitted:  # fmt: skip
        """Submit `job` on shard `first`. Caps hold per shard (a script sees one shard's
        counters), so a job refused by a full shard tries the others unless it is pinned:
        the queue refuses only when every shard is full (`depth` then counts them all)."""
        shards = self.queue.shards
        for step in range(1 if pinned else shards):
            if step:
                job.id = new_job_id(job.model, (first + step) % shards, shards)
            done = await self.queue.submit(
                job, max_queue=per_shard(limit, shards),
                max_bytes=per_shard(self.settings.max_queue_bytes, shards),
                idempotency_key=key_hash, idempotency_ttl_s=self.settings.idempotency_ttl_s,
                wait=wait,
            )  # fmt: skip
            if done.outcome not in ("full", "full_bytes"):
                return done
        if shards > 1:
            total = (
                self.queue.queued_bytes if done.outcome == "full_bytes" else self.queue.queued_items
            )
            done.depth = await total(job.model)
        return done

    async def _answer_cached(
        self, job: Job, outputs: bytes, key_hash: str | None
    ) -> tuple[Job, bool]:
        """Record `job` as succeeded with the cached outputs; no worker runs it. Not counted
        as submitted (it never entered the queue): `inferq_cache_lookups_total` counts it."""
        job.status, job.cached = Status.SUCCEEDED, True
        job.started_ms = job.finished_ms = job.created_ms
        fields = encode_submit(job) | encode_final(Status.SUCCEEDED, finished_ms=job.created_ms)
        fields[JobField.OUTPUTS] = outputs  # already packed as the worker packed it
        done = await self.queue.record_cached(
            job, fields, idempotency_key=key_hash,
            idempotency_ttl_s=self.settings.idempotency_ttl_s,
        )  # fmt: skip
        if done.outcome == "duplicate":
            return await self.get(done.job_id, job.tenant), False
        job.outputs = decode_outputs(msgpack.unpackb(outputs, raw=False))
        return job, False

    @staticmethod
    def _retry_after(items: int, rate: float) -> int:
        return max(1, math.ceil(items / rate)) if rate > 0 else 1

    def _reject(self, model: str, depth: int, items: int, rate: float, timeout_s: float) -> None:
        # Retry when enough of the queue ahead has drained for this job to fit.
        excess = depth + items - min(self.settings.max_queue, max(items, int(rate * timeout_s)))
        retry = max(1, math.ceil(excess / rate)) if rate > 0 else max(1, math.ceil(depth / 100))
        if depth + items > self.settings.max_queue:
            raise Overloaded(
                f"model {model!r} has {depth} items queued (INFERQ_MAX_QUEUE={self.settings.max_queue})",
                retry,
                "queue_full",
            )
        raise Overloaded(
            f"predicted wait {depth / rate:.1f}s ({depth} items at {rate:.0f}/s) exceeds the job's "
            f"deadline of {timeout_s:g}s",
            retry,
            "deadline",
        )

    async def run(
        self, sub: Submission, wait_s: float, gone: Callable[[], Awaitable[None]]
    ) -> Job | None:
        """Submit and wait up to `wait_s`; None if the client left first (`gone()` returned),
        in which case the job is cancelled unless a worker has started it. `gone` is called
        only once the job exists, so a refused submit leaves no un-awaited coroutine behind."""
        job = await self.submit(sub)
        if job.status.is_final:  # answered from the cache, or a repeat of a finished job
            return job
        queued = job if job.status is Status.QUEUED else None  # just created: no re-read
        waiter = asyncio.ensure_future(self.wait(job.id, wait_s, sub.tenant, submitted=queued))
        left = asyncio.ensure_future(gone())
        try:
            await asyncio.wait({waiter, left}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
        if waiter.done():
            return waiter.result()
        waiter.cancel()
        with contextlib.suppress(RequestError):
            await self.cancel(job.id, sub.tenant, only_if_queued=True)
        return None

    async def get(self, job_id: str, tenant: str = "") -> Job:
        job = await self.queue.get(job_id)
        if job is None or job.tenant != tenant:
            raise JobNotFound(f"no job {job_id!r}")
        if job.status is Status.QUEUED and job.deadline_ms and now_ms() > job.deadline_ms:
            # No worker read it in time (maybe none serves the model): it ends here, so it
            # also stops counting against the queue and gets its TTL.
            fields = encode_final(
                Status.EXPIRED,
                finished_ms=now_ms(),
                error=JobError(ErrorCode.EXPIRED, "deadline passed in queue"),
            )
            await self.queue.cancel(job, fields, only_if_queued=True)
            job = await self.queue.get(job_id) or job
        return job

    async def progress(self, job: Job) -> tuple[int | None, int | None]:
        """(position, eta_ms) of a queued job; (None, None) otherwise."""
        if job.status is not Status.QUEUED:
            return None, None
        position = await self.queue.position(job)
        rate = await self.throughput(job.model)
        eta = int((position + len(job.inputs)) / rate * 1000) if rate > 0 else None
        return position, eta

    async def cancel(self, job_id: str, tenant: str = "", *, only_if_queued: bool = False) -> Job:
        job = await self.get(job_id, tenant)
        if job.status.is_final:
            raise JobConflict(f"job {job_id!r} already ended: {job.status}")
        fields = encode_final(
            Status.CANCELLED,
            finished_ms=now_ms(),
            error=JobError(ErrorCode.CANCELLED, "cancelled by the client"),
        )
        done = await self.queue.cancel(job, fields, only_if_queued=only_if_queued)
        if done == 0:
            raise JobConflict(f"job {job_id!r} already ended")
        return await self.get(job_id, tenant)

    def clamp_wait(self, wait_s: float | None, default_s: float) -> float:
        return min(default_s if wait_s is None else wait_s, self.settings.max_long_poll_s)

    def shutdown(self) -> None:
        """Open long-polls answer now with the current state; new ones do not wait."""
        self.shutting_down = True
        self.notifier.wake_all()

    @staticmethod
    def _published(payload: bytes | None, job_id: str, tenant: str) -> Job | None:
        """The final job a completion message carried, if it is this caller's."""
        job = decode_published(payload) if payload else None
        if job is None or job.id != job_id or job.tenant != tenant or not job.status.is_final:
            return None  # read it back instead (get() applies the tenant check)
        return job

    async def wait(
        self, job_id: str, wait_s: float, tenant: str = "", submitted: Job | None = None
    ) -> Job:
        """Return the job as soon as it is final, or its current state after `wait_s`.

        `submitted`: the job as this process just created it (queued), so the first read
        can be skipped: the notifier remembers a completion that beat this watch."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        published: Job | None = None  # what the last completion message carried
        while True:
            fut = self.notifier.watch(job_id)  # watch first, then read: no gap to miss
            try:
                first, submitted = submitted, None  # only ever stands in for the first read
                if published is not None:
                    job = published
                elif first is not None and not fut.done():
                    job = first
                else:
                    job = await self.get(job_id, tenant)
                remaining = deadline - loop.time()
                if job.status.is_final or remaining <= 0 or self.shutting_down:
                    return job
                with contextlib.suppress(TimeoutError):
                    payload = await asyncio.wait_for(
                        fut, min(remaining, self.settings.long_poll_recheck_s)
                    )
                    published = self._published(payload, job_id, tenant)
            finally:
                self.notifier.unwatch(job_id, fut)
