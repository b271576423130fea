"""`Submission.answered_inline`: which records of a request answered in its own response
live INFERQ_SYNC_RESULT_TTL_S, and which keep what they asked for."""

from __future__ import annotations

import asyncio

import pytest

from inferq.api.core.decode import Submission
from inferq.api.core.service import JobService
from inferq.shared.errors import QueueUnavailable
from inferq.shared.jobs import Job, Status
from inferq.shared.settings import Settings


@pytest.mark.parametrize(
    ("sub", "ttl"),
    [
        (Submission(), 120),  # plain: brief
        (Submission(idempotency_key="k"), 120),  # a key's retry comes within the brief time
        (Submission(result_ttl_s=900), 900),  # its own TTL: kept as asked
        (Submission(webhook="https://hooks.example/x"), None),  # a webhook: the default hour
    ],
)
def test_a_request_answered_in_its_response_is_kept_briefly_unless_it_asked(
    sub: Submission, ttl: int | None
) -> None:
    asked = sub.result_ttl_s is not None or sub.webhook is not None
    assert sub.answered_inline(Settings(_env_file=None)) is not asked
    assert sub.result_ttl_s == ttl


def test_the_brief_time_is_capped_at_the_default() -> None:
    sub = Submission()
    assert sub.answered_inline(Settings(_env_file=None, result_ttl_s=30, sync_result_ttl_s=120))
    assert sub.result_ttl_s == 30


class _Run:
    """`JobService.run` around stand-ins for what it calls: `create` (records the submission
    it got), `follow` (the wait's outcome) and the queue's `keep`."""

    def __init__(self, outcome: Status | None, keep_fails: bool = False) -> None:
        self.outcome, self.keep_fails = outcome, keep_fails
        self.created: list[Submission] = []
        self.kept: list[str] = []
        self.service = JobService.__new__(JobService)
        self.service.settings = Settings(_env_file=None)
        self.service.queue = self  # type: ignore[assignment]
        self.service.create = self.create  # type: ignore[method-assign]
        self.service.follow = self.follow  # type: ignore[method-assign]

    async def create(self, sub: Submission) -> tuple[Job, bool]:
        self.created.append(sub)
        return Job(id="j", model="echo", inputs=["x"]), True

    async def follow(self, job: Job, *_: object) -> Job | None:
        if self.outcome is None:
            return None
        job.status = self.outcome
        return job

    async def keep(self, job: Job) -> None:
        if self.keep_fails:
            raise QueueUnavailable("redis failing over")
        self.kept.append(job.id)


async def _gone() -> None:
    await asyncio.Event().wait()


@pytest.mark.parametrize(
    ("sub", "outcome", "kept"),
    [
        (Submission(), Status.SUCCEEDED, []),  # answered: stays brief
        (Submission(), Status.QUEUED, ["j"]),  # a 202: its Location must find it later
        (Submission(), None, []),  # the client left: nobody comes back for it
        (Submission(result_ttl_s=900), Status.QUEUED, []),  # never brief: nothing to restore
    ],
)
async def test_a_wait_that_ends_in_202_restores_the_default_lifetime(
    sub: Submission, outcome: Status | None, kept: list[str]
) -> None:
    asked = sub.result_ttl_s
    run = _Run(outcome)
    await run.service.run(sub, 0.0, _gone)
    assert run.kept == kept
    assert run.created[0].result_ttl_s == (asked or 120)


async def test_a_redis_blip_while_restoring_does_not_cost_the_202() -> None:
    run = _Run(Status.QUEUED, keep_fails=True)
    job = await run.service.run(Submission(), 0.0, _gone)
    assert job is not None and job.status is Status.QUEUED
