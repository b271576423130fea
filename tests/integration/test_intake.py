"""The worker's intake on the session's real Redis (its CLAIM is Lua), with a fake clock: how
each job read is decided, what an idle claim counts, and the prefetch bound."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.jobs import ErrorCode, Job, JobError, Status, encode_final, new_job_id
from inferq.shared.registry import WorkerRegistry
from inferq.shared.settings import Settings
from inferq.worker.intake import Intake
from inferq.worker.models.echo import EchoModel
from tests.integration.inprocess import FakeClock, InProcess, Recorder, until
from tests.queues import JobQueue

NOW_MS = 1_000_000


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    yield r
    await r.aclose()


def _intake(r: Redis, clock: FakeClock, **settings: object) -> tuple[Intake, JobQueue]:
    s = Settings(_env_file=None, model="echo", max_deliveries=3, **settings)  # type: ignore[arg-type]
    queue = JobQueue(r, result_ttl_s=60)
    model = EchoModel()
    model.load("cpu")
    intake = Intake(
        queue, WorkerRegistry(r), model, s, model_name="echo", consumer="w1", clock=clock
    )
    return intake, queue


async def _submit(queue: JobQueue, *inputs: object, **fields: object) -> str:
    job = Job(id=new_job_id("echo"), model="echo", inputs=list(inputs), **fields)  # type: ignore[arg-type]
    assert (await queue.submit(job)).outcome == "created"
    return job.id


async def test_each_job_read_is_held_decided_or_acked(redis: Redis) -> None:
    clock = FakeClock()
    clock.wall_ms = NOW_MS
    intake, queue = _intake(redis, clock)
    await queue.ensure_group("echo")
    ok = await _submit(queue, "a b", "c")
    late = await _submit(queue, "x", deadline_ms=NOW_MS - 1)
    poison = await _submit(queue, "y", attempts=3)
    bad = await _submit(queue, {"image": b"\xff\xd8\xff"})  # echo takes text only
    gone = await _submit(queue, "z")
    gone_job = await queue.get(gone)
    assert gone_job is not None
    cancelled = encode_final(
        Status.CANCELLED, finished_ms=NOW_MS, error=JobError(ErrorCode.CANCELLED, "by test")
    )
    await queue.cancel(gone_job, cancelled, only_if_queued=True)
    assert await intake.fetch(100, lambda _: False) == []  # its own pending list first: empty
    entries = await intake.fetch(100, lambda _: False)
    assert {e.job_id for e in entries} == {ok, late, poison, bad, gone}
    out = await intake.admit(entries)
    assert [(s.job.id, [it.cost for it in items]) for s, items in out.held] == [(ok, [2, 1])]
    decided = {s.job.id: (e.code, st, s.dead_letter) for s, e, st in out.decided}
    assert decided == {
        late: (ErrorCode.EXPIRED, Status.EXPIRED, False),
        poison: (ErrorCode.POISONED, Status.FAILED, True),
        bad: (ErrorCode.INVALID_INPUT, Status.FAILED, False),
    }
    assert [e.job_id for e in out.stale] == [gone]
    # Claimed: running, not counted as a device start (nothing was idle about this read).
    held = await queue.get(ok)
    assert held is not None and held.status is Status.RUNNING and held.attempts == 0
    intake.shutdown()


async def test_an_idle_claim_of_a_lone_job_counts_its_start_and_leaves_it_unprepared(
    redis: Redis,
) -> None:
    clock = FakeClock()
    intake, queue = _intake(redis, clock)
    await queue.ensure_group("echo")
    lone = await _submit(queue, "alone")
    assert await intake.fetch(10, lambda _: False) == []  # its own pending list first
    out = await intake.admit(await intake.fetch(10, lambda _: False), idle=True)
    assert out.held == [] and out.alone is not None  # not prepared: it runs in one hop
    assert out.alone[1].id == lone
    job = await queue.get(lone)
    assert job is not None and job.attempts == 1
    # Two jobs read together: neither is counted here (the one that waits must not be).
    a, b = await _submit(queue, "a"), await _submit(queue, "b")
    out = await intake.admit(await intake.fetch(10, lambda _: False), idle=True)
    assert len(out.held) == 2 and out.alone is None
    assert not any(s.counted for s, _ in out.held)
    for job_id in (a, b):
        job = await queue.get(job_id)
        assert job is not None and job.attempts == 0
    intake.shutdown()


async def test_a_worker_holds_no_more_than_its_prefetch(redis_url: str) -> None:
    """With the device held up, the worker reads until it holds `prefetch_items` and no
    further: the rest stays in the stream for other workers."""
    model = Recorder()
    model.gate.clear()  # the first batch blocks on the device
    w = InProcess(redis_url, model, prefetch_items=4, max_batch_size=2)
    try:
        ids = [await w.submit(f"t{i}") for i in range(10)]
        worker = await w.start()
        await until(lambda: worker.book.held_items() == 4, 10, "4 items held")
        assert await w.admin.xlen(keys.stream("echo")) == 10  # none acked yet
        pending = await w.admin.xpending(keys.stream("echo"), keys.GROUP)
        assert pending["pending"] == 4  # exactly what it holds was read
        model.gate.set()
        for job_id in ids:
            assert (await w.final(job_id)).status is Status.SUCCEEDED
    finally:
        await w.close()
