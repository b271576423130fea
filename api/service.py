"""What the routes do, without HTTP: validate against limits, submit, wait for final."""

from __future__ import annotations

import asyncio
import contextlib

from api.notifier import Notifier
from shared.errors import InputRejected, JobNotFound, ModelNotServed
from shared.jobs import Job, new_job_id
from shared.queue import JobQueue
from shared.settings import Settings

# Even with pub/sub a waiter re-reads this often: a missed message costs at most this long.
RECHECK_S = 2.0


class JobService:
    def __init__(self, settings: Settings, queue: JobQueue, notifier: Notifier) -> None:
        self.settings = settings
        self.queue = queue
        self.notifier = notifier
        self.models = settings.served_models

    def resolve_model(self, requested: str | None) -> str:
        name = requested or self.settings.default_model.name
        if name not in self.models:
            served = ", ".join(sorted(self.models))
            raise ModelNotServed(f"model {name!r} is not served here; served: {served}")
        return name

    def check_inputs(self, texts: list[str]) -> None:
        s = self.settings
        if len(texts) > s.max_inputs_per_job:
            raise InputRejected(
                f"{len(texts)} inputs exceed INFERQ_MAX_INPUTS_PER_JOB={s.max_inputs_per_job}", 413
            )
        for i, t in enumerate(texts):
            if len(t) > s.max_input_chars:
                raise InputRejected(
                    f"input {i} has {len(t)} characters, over INFERQ_MAX_INPUT_CHARS={s.max_input_chars}",
                    413,
                )
            if not t.strip():
                raise InputRejected(f"input {i} is empty", 422)

    async def submit(self, texts: list[str], model: str | None, tenant: str = "") -> Job:
        name = self.resolve_model(model)
        self.check_inputs(texts)
        job = Job(id=new_job_id(), model=name, inputs=texts, tenant=tenant)
        await self.queue.submit(job)
        return job

    async def get(self, job_id: str, tenant: str = "") -> Job:
        job = await self.queue.get(job_id)
        if job is None or job.tenant != tenant:
            raise JobNotFound(f"no job {job_id!r}")
        return job

    def clamp_wait(self, wait_s: float | None, default_s: float) -> float:
        return min(default_s if wait_s is None else wait_s, self.settings.max_long_poll_s)

    async def wait(self, job_id: str, wait_s: float, tenant: str = "") -> Job:
        """Return the job as soon as it is final, or its current state after `wait_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            fut = self.notifier.watch(job_id)  # watch first, then read: no gap to miss
            try:
                job = await self.get(job_id, tenant)
                remaining = deadline - loop.time()
                if job.status.is_final or remaining <= 0:
                    return job
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fut, min(remaining, RECHECK_S))
            finally:
                self.notifier.unwatch(job_id, fut)
