"""What the routes do, without HTTP: one submit(-and-wait) pipeline for every route.

`submit` resolves the model, checks the inputs against what the model takes (its workers
declare it in Redis: input kinds, parameter names; `catalog`), admits (items, bytes, and
whether the queue ahead can finish before the deadline; `admission`), records and enqueues,
and counts the job as submitted or rejected. `run` is submit then wait, cancelling the job
if the client leaves before any worker has started it. `/v1/jobs`, `/v1/infer`,
`/v1/embeddings` and batch lines all come through here, so metrics, admission, idempotency
and cancel-on-disconnect are the same on all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from prometheus_client import Counter

from inferq.api.core.admission import Admission, ModelCatalog, RedisMemory
from inferq.api.core.cache import ResultCache
from inferq.api.core.decode import Submission, image_kinds, item_kinds, wire_images, wire_inputs
from inferq.api.core.errors import refusal_reason
from inferq.api.core.idempotency import key_reused, request_fingerprint
from inferq.shared import keys
from inferq.shared.errors import (
    InputInvalid,
    JobConflict,
    JobNotFound,
    QueueUnavailable,
    RequestError,
)
from inferq.shared.jobs import (
    ErrorCode,
    Job,
    JobError,
    Status,
    decode_outputs,
    encode_final,
    encode_submit,
    inputs_bytes,
    new_job_id,
    now_ms,
    published_job,
)
from inferq.shared.metrics import ApiMetrics
from inferq.shared.producer import JobProducer, Notifier
from inferq.shared.queue import Idempotency, Submitted, per_shard
from inferq.shared.schema import JobField
from inferq.shared.settings import Settings

#: What `JobProducer.submit` answers when a cap refused the job on that shard.
REFUSED = ("full", "full_bytes", "tenant_full", "tenant_bytes")
#: The `model` label of a refused submit that named no served model: a client's string
#: never becomes a label value (each would be a series kept for the process's life).
UNKNOWN_MODEL = "unknown"
FINGERPRINT_ON_LOOP_BYTES = 1 << 20  # inputs up to this are fingerprinted on the loop (µs)
Gone = Callable[[], Awaitable[None]]  # what a wait awaits to end when its client leaves
#: A sync wait watches for its client's leaving (a task, and a wait on two futures: ~4 % of
#: the API's CPU a request, docs/benchmarks.md) only once it outlives this; most answers
#: come sooner. A client that left meanwhile is seen then: the server keeps the disconnect.
WATCH_CLIENT_AFTER_S = 0.2


@dataclass(slots=True)
class _Placement:
    """Where a new job goes: its first shard, and whether the shard is pinned (a repeat of
    an Idempotency-Key must meet its first job, a cache lookup the shard that filled it)."""

    first: int
    pinned: bool
    key_hash: str | None
    digest: str | None
    fingerprint: str | None = None  # of what the key's request asked (`request_fingerprint`)


#: The webhook's submit check (`inferq.api.webhooks.contract.submit_target`), handed in by
#: `create_app` so the job pipeline does not import the webhook subsystem.
WebhookTarget = Callable[
    [Settings, str, str | None, tuple[str, ...] | None], Awaitable[dict[str, Any] | None]
]


@dataclass(frozen=True, slots=True)
class Checks:
    """What a submission passes before it is queued, each built by `create_app`: the model
    catalog (what each model takes), admission (how much a queue may hold), the result cache,
    the Redis memory guard, and the webhook check."""

    catalog: ModelCatalog
    admission: Admission
    cache: ResultCache | None  # None while INFERQ_CACHE_TTL_S is 0: no lookup at all
    memory: RedisMemory
    webhook_target: WebhookTarget


class JobService:
    def __init__(
        self,
        settings: Settings,
        queue: JobProducer,
        notifier: Notifier,
        metrics: ApiMetrics,
        checks: Checks,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.notifier = notifier
        self.metrics = metrics
        self._submitted: dict[str, Counter] = {}  # `jobs_submitted` by model
        self.catalog = checks.catalog
        self.admission = checks.admission
        self.cache = checks.cache
        self.memory = checks.memory
        self._webhook_target = checks.webhook_target
        self.shutting_down = False
        self._turn = itertools.count(random.randrange(1024))  # the next unpinned job's shard
        # Caps hold per shard (a script sees one shard's counters): the fixed ones, once.
        shards, caps = queue.shards, self.admission.tenant_caps()
        self._shard_bytes = per_shard(settings.max_queue_bytes, shards)
        self._shard_tenant_caps = (per_shard(caps[0], shards), per_shard(caps[1], shards))
        self._replicas_wait = (settings.redis_wait_replicas, self._wait_ms())

    # --- submit ---
    async def submit(self, sub: Submission) -> Job:
        """Admit, record, enqueue; every accepted and every refused job is counted."""
        return (await self.create(sub))[0]

    async def create(self, sub: Submission) -> tuple[Job, bool]:
        """`submit`, and whether this call made the job: False for an Idempotency-Key repeat
        (the first request's job, which this one must never cancel) and for a job answered
        from the cache (final at birth). A key reused with other inputs, parameters or
        webhook is refused (`KeyReused`, 422): it would answer with another request's job."""
        await self.memory.check()  # 503 while Redis is nearly full: before anything else
        try:
            job, created = await self._submit(sub)
        except RequestError as e:
            model = sub.model or self.catalog.default
            label = model if model in self.catalog.names else UNKNOWN_MODEL
            self.metrics.jobs_rejected.labels(model=label, reason=refusal_reason(e)).inc()
            raise
        if created:  # an Idempotency-Key repeat returns the first job: not a new submission
            if (counter := self._submitted.get(job.model)) is None:  # labels(): ~2 µs a call
                counter = self._submitted[job.model] = self.metrics.jobs_submitted.labels(job.model)
            counter.inc()
        return job, created

    async def _job(self, sub: Submission) -> Job:
        """The job a submission asks for, checked (model, input kinds, then each input,
        webhook), not yet placed. Kinds first: an input the model cannot take is refused
        before any of it is converted."""
        name = self.catalog.resolve(sub.model)
        if sub.files:
            await self.catalog.check(name, image_kinds(sub.files), sub.parameters)
            inputs, _ = wire_images(sub.files, self.settings)
        else:
            await self.catalog.check(name, item_kinds(sub.items, self.settings), sub.parameters)
            inputs, _ = wire_inputs(sub.items, self.settings)
        webhook = None
        if sub.webhook is not None:
            _, _, backlog = await self.queue.tenant_held(name, sub.tenant)
            if (refusal := self.admission.webhook_refusal(sub.tenant, backlog)) is not None:
                raise refusal
            # 422 without a signing key or for a URL the SSRF guard refuses (resolved off-loop).
            webhook = await self._webhook_target(
                self.settings, sub.tenant, sub.webhook, sub.webhook_events
            )
        timeout_s = sub.timeout_s or self.settings.job_timeout_s
        created = now_ms()
        job = Job(
            id="",
            model=name,
            inputs=inputs,
            tenant=sub.tenant,
            priority=sub.priority,
            created_ms=created,
            deadline_ms=created + int(timeout_s * 1000),
            parameters=sub.parameters,
        )
        job.webhook = webhook
        job.metadata = sub.metadata
        if sub.result_ttl_s is not None:
            if sub.result_ttl_s > self.settings.result_ttl_max_s:
                raise InputInvalid(
                    f"result_ttl_s={sub.result_ttl_s} is over this server's maximum, "
                    f"{self.settings.result_ttl_max_s} s (INFERQ_RESULT_TTL_MAX_S)"
                )
            job.result_ttl_s = sub.result_ttl_s
        return job

    async def _place(self, job: Job, idempotency_key: str | None) -> _Placement:
        key_hash = fingerprint = None
        if idempotency_key is not None:
            key_hash = hashlib.sha256(idempotency_key.encode()).hexdigest()
            size = inputs_bytes(job.inputs)
            # Hashing megabytes is milliseconds of CPU: off the event loop, as parsing is.
            fingerprint = (
                request_fingerprint(job)
                if size < FINGERPRINT_ON_LOOP_BYTES
                else await asyncio.to_thread(request_fingerprint, job)
            )
        digest = None
        cache = self.cache
        if (
            cache is not None
            and cache.enabled(job.model)
            and (info := await self.catalog.info(job.model))
        ):
            digest = cache.digest(job, info.version) if info.version else None
        pin = key_hash or digest
        shards = self.queue.shards
        first = int(pin[:8], 16) % shards if pin else next(self._turn) % shards
        return _Placement(first, pin is not None, key_hash, digest, fingerprint)

    async def _submit(self, sub: Submission) -> tuple[Job, bool]:
        job = await self._job(sub)
        # The inputs' bytes are reserved against the memory guard until written (a Redis OOM
        # meanwhile answers as the guard's 503): concurrent submits cannot all pass one check.
        async with self.memory.admit(inputs_bytes(job.inputs)) as held:
            job, created = await self._record(job, sub)
            if created:
                held.landed()
            return job, created

    async def _record(self, job: Job, sub: Submission) -> tuple[Job, bool]:
        place = await self._place(job, sub.idempotency_key)
        shards = self.queue.shards
        job.id = new_job_id(job.model, place.first, shards)
        if place.digest is not None and self.cache is not None:
            key = keys.cache(place.digest, job.model, place.first, shards)
            hit = await self.cache.get(key)
            result = "hit" if hit else "miss"
            self.metrics.cache_lookups.labels(model=job.model, result=result).inc()
            if hit is not None:
                return await self._answer_cached(job, hit, place)
            job.cache = self.cache.spec(key)
        rate = await self.catalog.throughput(job.model)
        timeout_s = (job.deadline_ms - job.created_ms) / 1000
        limit = self.admission.limit(len(job.inputs), rate, timeout_s)
        done = await self._enqueue(job, limit, place)
        self._check_replicas(done)
        if done.outcome == "conflict":
            raise key_reused(sub.idempotency_key, done.job_id)
        if done.outcome == "duplicate":
            return await self.get(done.job_id, sub.tenant), False
        if done.outcome == "full_bytes":
            raise self.admission.too_many_bytes(job.model, done.depth, len(job.inputs), rate)
        if done.outcome == "full":
            raise self.admission.too_many_items(
                job.model, done.depth, len(job.inputs), rate, timeout_s
            )
        if done.outcome in ("tenant_full", "tenant_bytes"):
            raise self.admission.tenant_refusal(
                done.outcome, job.tenant, job.model, done.depth, len(job.inputs), rate
            )
        return job, True

    def _check_replicas(self, done: Submitted) -> None:
        wait = self.settings.redis_wait_replicas
        if done.replicas is not None and done.replicas < wait:
            # The job is on the master (and runs), but a failover now could lose it: refuse
            # the acknowledgement. A retry with the same Idempotency-Key finds it, and is
            # answered once the replicas have it.
            raise QueueUnavailable(
                f"job {done.job_id} reached {done.replicas} of {wait} replicas within "
                f"{self._wait_ms()} ms (INFERQ_REDIS_WAIT_REPLICAS)"
            )

    def _wait_ms(self) -> int:
        # WAIT within three quarters of the socket timeout, so its reply always comes back.
        return int(self.settings.redis_timeout_s * 750)

    async def _enqueue(self, job: Job, limit: int, place: _Placement) -> Submitted:
        """Submit `job` on shard `place.first`. Caps hold per shard (a script sees one
        shard's counters), so a job refused by a full shard tries the others unless it is
        pinned: the queue refuses only when every shard is full (`depth` then counts them
        all)."""
        shards = self.queue.shards
        for step in range(1 if place.pinned else shards):
            if step:
                job.id = new_job_id(job.model, (place.first + step) % shards, shards)
            done = await self.queue.submit(
                job,
                max_queue=per_shard(limit, shards),
                max_bytes=self._shard_bytes,
                idempotency=self._idempotency(place),
                wait=self._replicas_wait,
                tenant_caps=self._shard_tenant_caps,
            )
            if done.outcome not in REFUSED:
                return done
        if shards > 1:  # every shard refused: say what the whole model holds
            done.depth = await self._held(job, done.outcome)
        return done

    def _idempotency(self, place: _Placement) -> Idempotency | None:
        if place.key_hash is None:
            return None
        return Idempotency(place.key_hash, self.settings.idempotency_ttl_s, place.fingerprint or "")

    async def _held(self, job: Job, outcome: str) -> int:
        """What a refusal's cap counts, over every shard of the model."""
        if outcome == "full":
            return await self.queue.queued_items(job.model)
        if outcome == "full_bytes":
            return await self.queue.queued_bytes(job.model)
        items, size, _ = await self.queue.tenant_held(job.model, job.tenant)
        return items if outcome == "tenant_full" else size

    async def _answer_cached(self, job: Job, outputs: bytes, place: _Placement) -> tuple[Job, bool]:
        """Record `job` as succeeded with the cached outputs; no worker runs it. Not counted
        as submitted (it never entered the queue): `inferq_cache_lookups_total` counts it."""
        job.status, job.cached = Status.SUCCEEDED, True
        job.started_ms = job.finished_ms = job.created_ms
        fields = encode_submit(job) | encode_final(Status.SUCCEEDED, finished_ms=job.created_ms)
        fields[JobField.OUTPUTS] = outputs  # already packed as the worker packed it
        done = await self.queue.record_cached(job, fields, idempotency=self._idempotency(place))
        if done.outcome == "conflict":
            raise key_reused(None, done.job_id)
        if done.outcome == "duplicate":
            return await self.get(done.job_id, job.tenant), False
        job.outputs = decode_outputs(msgpack.unpackb(outputs, raw=False))
        return job, False

    # --- submit and wait ---
    async def run(self, sub: Submission, wait_s: float, gone: Gone) -> Job | None:
        """Submit and wait up to `wait_s`; None if the client left first (`gone()` returned),
        in which case the job is cancelled unless a worker has started it. `gone` is called
        only once the job exists, so a refused submit leaves no un-awaited coroutine behind."""
        brief = sub.answered_inline(self.settings)
        job, created = await self.create(sub)
        final = await self.follow(job, created, sub.tenant, wait_s, gone)
        if final is not None and not final.status.is_final and brief:
            # A 202: its Location must find the record (a Redis blip must not cost the 202).
            with contextlib.suppress(QueueUnavailable):
                await self.queue.keep(job)
        return final

    async def follow(
        self, job: Job, created: bool, tenant: str, wait_s: float, gone: Gone
    ) -> Job | None:
        """`run`'s wait for a job `create` answered: the job as soon as it is final or after
        `wait_s`; None if the client left first, and then the job is cancelled if `created`
        (a repeat's job belongs to the request that made it) and no worker has started it."""
        if job.status.is_final:  # answered from the cache, or a repeat of a finished job
            return job
        # The inputs are in Redis now: the wait holds none of the request's bytes.
        job.inputs = []
        # Made here (its record names this process): no first read; a repeat's is read.
        queued = job if created and job.status is Status.QUEUED else None
        final = await self._wait(job.id, wait_s, tenant, queued, gone)
        if final is not None:
            return final
        if created:
            with contextlib.suppress(RequestError):
                await self.cancel(job.id, tenant, only_if_queued=True)
        return None

    # --- read, cancel ---
    async def get(self, job_id: str, tenant: str = "", *, listen: bool = False) -> Job:
        job = await self.queue.get(job_id, listen=listen)
        if job is None or job.tenant != tenant:
            raise JobNotFound(f"no job {job_id[:128]!r}")
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
        rate = await self.catalog.throughput(job.model)
        eta = int((position + len(job.inputs)) / rate * 1000) if rate > 0 else None
        return position, eta

    async def cancel(self, job_id: str, tenant: str = "", *, only_if_queued: bool = False) -> Job:
        """End a job that has not ended. A queued one is `cancelled` at once; a running one is
        marked, and its worker ends it `cancelled` with the outputs it has at its next batch
        boundary (the answer shows `cancel_requested`), unless `only_if_queued`."""
        job = await self.get(job_id, tenant)
        fields = encode_final(
            Status.CANCELLED,
            finished_ms=now_ms(),
            error=JobError(ErrorCode.CANCELLED, "cancelled by the client"),
        )
        for _ in range(3):  # a stopping worker may hand it back to the queue meanwhile
            if job.status.is_final:
                raise JobConflict(f"job {job_id!r} already ended: {job.status}")
            done = await self.queue.cancel(job, fields, only_if_queued=True)
            if done == 1 or only_if_queued:
                return await self.get(job_id, tenant)
            if done == -1:
                raise JobNotFound(f"no job {job_id[:128]!r}")
            if done == 2 and await self.queue.request_cancel(job_id) == Status.RUNNING:
                return await self.get(job_id, tenant)
            job = await self.get(job_id, tenant)
        raise JobConflict(f"job {job_id!r} is changing hands between workers: try again")

    # --- wait ---
    def clamp_wait(self, wait_s: float | None, default_s: float) -> float:
        return min(default_s if wait_s is None else wait_s, self.settings.max_long_poll_s)

    def shutdown(self) -> None:
        """Open long-polls answer now with the current state; new ones do not wait."""
        self.shutting_down = True
        self.notifier.wake_all()

    async def wait(
        self, job_id: str, wait_s: float, tenant: str = "", submitted: Job | None = None
    ) -> Job:
        """The job as soon as it is final, or its current state after `wait_s` (`_wait`)."""
        job = await self._wait(job_id, wait_s, tenant, submitted, None)
        assert job is not None  # only a client's leaving (`left`) ends a wait without one
        return job

    async def _wait(
        self,
        job_id: str,
        wait_s: float,
        tenant: str,
        submitted: Job | None,
        gone: Gone | None,
    ) -> Job | None:
        """`wait`, and None once `gone()` (the client's disconnect) returns: from
        `WATCH_CLIENT_AFTER_S` on, the request's own task races the completion against it
        (no task of its own for the wait). `submitted`: the job as this process just created
        it (queued): no first read, as the notifier remembers a completion that beat this
        watch. Each read has this process told of the job's end (`listen`). A client that
        leaves during a re-read is seen after it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        watch_from = loop.time() + WATCH_CLIENT_AFTER_S
        published: Job | None = None  # what the last completion message carried
        left: asyncio.Future[None] | None = None
        try:
            while True:
                fut = self.notifier.watch(job_id)  # watch first, then read: no gap to miss
                try:
                    first, submitted = submitted, None  # only ever stands in for the first read
                    if published is not None:
                        job = published
                    elif first is not None and not fut.done():
                        job = first
                    else:
                        job = await self.get(job_id, tenant, listen=True)
                    now = loop.time()
                    if job.status.is_final or now >= deadline or self.shutting_down:
                        return job
                    recheck = min(deadline - now, self.settings.long_poll_recheck_s)
                    if gone is not None and left is None and now >= watch_from:
                        left = asyncio.ensure_future(gone())
                    if left is None:
                        # Until the client is watched; then, if nothing came (the timeout
                        # cancelled `fut`), on with no read between: the next watch sees a
                        # completion that came meanwhile (`Notifier.watch`).
                        grace = gone is not None and watch_from < now + recheck
                        until = watch_from if grace else now + recheck
                        published = await self._published(fut, until, job)
                        submitted = job if grace and fut.cancelled() else None
                        continue
                    await asyncio.wait(
                        (fut, left), timeout=recheck, return_when=asyncio.FIRST_COMPLETED
                    )
                    if fut.done():  # the completion first, even if the client left meanwhile
                        published = published_job(fut.result(), job)
                    elif left.done():
                        return None
                finally:
                    self.notifier.unwatch(job_id, fut)
        finally:
            if left is not None:
                left.cancel()

    @staticmethod
    async def _published(fut: asyncio.Future[bytes | None], until: float, job: Job) -> Job | None:
        """The final job a completion message described, if one comes by `until` (loop time):
        `job`, which this wait read or created, as it ended."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(until):
                return published_job(await fut, job)
        return None
