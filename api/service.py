"""What the routes do, without HTTP: validate, admit, submit, wait, cancel."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time

from inferq.api.notifier import Notifier
from inferq.shared.errors import (
    InputInvalid,
    InputTooLarge,
    JobConflict,
    JobNotFound,
    ModelNotServed,
    Overloaded,
)
from inferq.shared.jobs import ErrorCode, Job, JobError, Status, encode_final, new_job_id, now_ms
from inferq.shared.queue import JobQueue
from inferq.shared.registry import WorkerRegistry
from inferq.shared.settings import Settings

# Even with pub/sub a waiter re-reads this often: a missed message costs at most this long.
RECHECK_S = 2.0
# Worker throughput is read from heartbeats at most this often per model.
THROUGHPUT_TTL_S = 1.0


class JobService:
    def __init__(
        self, settings: Settings, queue: JobQueue, registry: WorkerRegistry, notifier: Notifier
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.registry = registry
        self.notifier = notifier
        self.models = settings.served_models
        self.shutting_down = False
        self._throughput: dict[str, tuple[float, float]] = {}  # model → (read at, items/s)

    def resolve_model(self, requested: str | None) -> str:
        name = requested or self.settings.default_model.name
        if name not in self.models:
            served = ", ".join(sorted(self.models))
            raise ModelNotServed(f"model {name!r} is not served here; served: {served}")
        return name

    def check_inputs(self, texts: list[str]) -> None:
        s = self.settings
        if len(texts) > s.max_inputs_per_job:
            raise InputTooLarge(
                f"{len(texts)} inputs exceed INFERQ_MAX_INPUTS_PER_JOB={s.max_inputs_per_job}"
            )
        for i, t in enumerate(texts):
            if len(t) > s.max_input_chars:
                raise InputTooLarge(
                    f"input {i} has {len(t)} characters, over INFERQ_MAX_INPUT_CHARS={s.max_input_chars}"
                )
            if not t.strip():
                raise InputInvalid(f"input {i} is empty")

    async def throughput(self, model: str) -> float:
        """Recent items/s of the model's live workers (cached briefly per process)."""
        now = time.monotonic()
        cached = self._throughput.get(model)
        if cached is not None and now - cached[0] < THROUGHPUT_TTL_S:
            return cached[1]
        value = await self.registry.throughput(model, now_ms())
        self._throughput[model] = (now, value)
        return value

    async def submit(
        self,
        texts: list[str],
        model: str | None,
        *,
        tenant: str = "",
        priority: str = "normal",
        timeout_s: float | None = None,
        idempotency_key: str | None = None,
    ) -> Job:
        name = self.resolve_model(model)
        self.check_inputs(texts)
        timeout_s = timeout_s or self.settings.job_timeout_s
        created = now_ms()
        job = Job(
            id=new_job_id(), model=name, inputs=texts, tenant=tenant, priority=priority,
            created_ms=created, deadline_ms=created + int(timeout_s * 1000),
        )  # fmt: skip
        rate = await self.throughput(name)
        # Admit only what can finish in time: the queue ahead drains at `rate` items/s.
        limit = self.settings.max_queue
        if rate > 0:
            limit = min(limit, max(len(texts), int(rate * timeout_s)))
        key_hash = None
        if idempotency_key is not None:
            key_hash = hashlib.sha256(idempotency_key.encode()).hexdigest()
        done = await self.queue.submit(
            job, max_queue=limit, idempotency_key=key_hash,
            idempotency_ttl_s=self.settings.idempotency_ttl_s,
        )  # fmt: skip
        if done.outcome == "duplicate":
            return await self.get(done.job_id, tenant)
        if done.outcome == "full":
            self._reject(name, done.depth, len(texts), rate, timeout_s)
        return job

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

    async def wait(
        self, job_id: str, wait_s: float, tenant: str = "", submitted: Job | None = None
    ) -> Job:
        """Return the job as soon as it is final, or its current state after `wait_s`.

        `submitted`: the job as this process just created it (queued), so the first read
        can be skipped: the notifier remembers a completion that beat this watch."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            fut = self.notifier.watch(job_id)  # watch first, then read: no gap to miss
            try:
                first, submitted = submitted, None  # only ever stands in for the first read
                if first is not None and not fut.done():
                    job = first
                else:
                    job = await self.get(job_id, tenant)
                remaining = deadline - loop.time()
                if job.status.is_final or remaining <= 0 or self.shutting_down:
                    return job
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fut, min(remaining, RECHECK_S))
            finally:
                self.notifier.unwatch(job_id, fut)
