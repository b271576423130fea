"""The worker's core in this process (no subprocess), on the session's real Redis, with
steerable models, a fake clock and a cuttable proxy: each behaviour in seconds."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from inferq.shared import keys
from inferq.shared.jobs import ErrorCode, Job, Status, decode_job, new_job_id
from inferq.worker.models.echo import expected_vector
from tests.integration.inprocess import FakeClock, InProcess, Proxy, Recorder, until


@pytest.fixture
async def inproc(redis_url: str) -> AsyncIterator[Any]:
    made: list[InProcess] = []

    def make(model: Recorder | None = None, **settings: Any) -> InProcess:
        w = InProcess(redis_url, model or Recorder(), **settings)
        made.append(w)
        return w

    yield make
    for w in made:
        await w.close()


async def test_a_failing_batch_is_split_until_the_bad_job_fails_alone(inproc: Any) -> None:
    w = inproc()
    ok = [await w.submit(f"fine {i}") for i in range(3)]
    bad = await w.submit("goes boom")
    await w.start()
    job = await w.final(bad)
    assert job.status is Status.FAILED and job.error is not None
    assert job.error.code == ErrorCode.MODEL_ERROR and "boom" in job.error.message
    for j, text in zip(ok, ("fine 0", "fine 1", "fine 2"), strict=True):
        good = await w.final(j)
        assert good.status is Status.SUCCEEDED
        assert good.outputs is not None and good.outputs.tolist() == [expected_vector(text)]
    runs = w.model.ran("goes boom")
    assert len(runs[0]) == 4 and runs[-1] == ["goes boom"], runs  # bisected down to it
    assert w.worker.telemetry.counts.splits >= 2


async def test_oom_splits_lowers_the_ceiling_and_fails_only_what_cannot_fit(inproc: Any) -> None:
    model = Recorder()
    model.oom_over = 12  # padded words
    w = inproc(model, max_batch_tokens=64, ceiling_recover_after=2)
    small = [await w.submit("a b c") for _ in range(8)]  # 8 × 3 = 24 padded: over the limit
    huge = await w.submit(" ".join(["w"] * 20))  # 20 alone: can never fit
    await w.start()
    for j in small:
        job = await w.final(j)
        assert job.status is Status.SUCCEEDED and job.batch_tokens <= 12
    too_large = await w.final(huge)
    assert too_large.status is Status.FAILED and too_large.error is not None
    assert too_large.error.code == ErrorCode.TOO_LARGE
    ceiling = w.worker.scheduler.ceiling
    assert w.worker.telemetry.counts.ooms >= 2 and ceiling.lowered >= 1 and ceiling.value < 24
    lowered = ceiling.value
    for i in range(6):  # successes raise it back, a step per `ceiling_recover_after`
        await w.final(await w.submit(f"x {i}"))
    assert ceiling.value > lowered


async def test_suspects_run_alone_least_suspicious_first(inproc: Any) -> None:
    w = inproc()
    healthy = [await w.submit(f"healthy {i}") for i in range(3)]
    twice = await w.submit("twice", attempts=2)
    once = await w.submit("once", attempts=1)
    await w.start()
    for j in [*healthy, twice, once]:
        assert (await w.final(j)).status is Status.SUCCEEDED
    assert w.model.ran("once") == [["once"]] and w.model.ran("twice") == [["twice"]]
    order = [b[0] for b in w.model.batches]
    assert order.index("once") < order.index("twice") < order.index("healthy 0")
    # Each suspect's device start was counted before it ran: a crash would have shown.
    job = decode_job(await w.admin.hgetall(keys.job(once)))
    assert job.attempts == 2


async def test_stop_hands_back_what_is_not_on_the_device(inproc: Any) -> None:
    model = Recorder()
    model.gate.clear()  # the first batch stays on the device until released
    w = inproc(model, max_batch_size=1, prefetch_items=8)
    first = await w.submit("on the device")
    waiting = [await w.submit(f"waiting {i}") for i in range(3)]
    worker = await w.start()
    await until(model.entered.is_set, 10, "the first batch on the device")
    await until(lambda: worker.book.held_items() == 4, 10, "all four held")
    worker.stop()
    for j in waiting:  # back in the queue at once, while the first batch still runs
        await until(lambda j=j: _status(w, j, Status.QUEUED), 10, f"{j} handed back")
    model.gate.set()
    assert await w.stop() is True
    assert (await w.final(first)).status is Status.SUCCEEDED
    for j in waiting:
        job = decode_job(await w.admin.hgetall(keys.job(j)))
        assert job.status is Status.QUEUED and job.attempts == 0 and job.started_ms is None
    assert await w.admin.xlen(keys.stream("echo")) == 3  # one fresh entry each
    assert worker.handed_back == 3 and model.batches == [["on the device"]]


async def test_an_idle_worker_counts_a_lone_jobs_start_in_its_claim(inproc: Any) -> None:
    """The quiet path: a job read by an idle worker alone has its device start counted by the
    claim, and its batch skips the START round trip; a job read while another runs, or one
    of two items, still goes through START. Either way the count is on the record before
    the model runs, so a crash on the device is seen."""
    model = Recorder()
    w = inproc(model)
    worker = await w.start()
    starts: list[list[str]] = []
    real_start = worker.queue.start

    async def spy(job_ids: Any, first: Any, done: Any) -> list[Any]:
        starts.append(list(job_ids))
        return await real_start(job_ids, first, done)

    worker.queue.start = spy  # type: ignore[method-assign]
    model.gate.clear()
    lone = await w.submit("alone")
    await until(model.entered.is_set, 10, "the lone job on the device")
    assert decode_job(await w.admin.hgetall(keys.job(lone))).attempts == 1
    beside = await w.submit("read while the first runs")
    await until(lambda: worker.book.knows(beside), 10, "the second job held")
    model.gate.set()
    assert (await w.final(lone)).status is Status.SUCCEEDED
    assert (await w.final(beside)).attempts == 1
    pair = await w.submit("one", "two")
    assert (await w.final(pair)).attempts == 1
    assert starts == [[beside], [pair]]


class ThreadRecorder(Recorder):
    """Records which thread prepared each input, and which ran each batch."""

    def __init__(self) -> None:
        super().__init__()
        self.prepared_in: list[str] = []
        self.ran_in: list[str] = []

    def prepare(self, inputs: Any, parameters: Any) -> Any:
        self.prepared_in.append(threading.current_thread().name.split("_")[0])
        return super().prepare(inputs, parameters)

    def run(self, batch: list[Any]) -> Any:
        self.ran_in.append(threading.current_thread().name.split("_")[0])
        return super().run(batch)


async def test_the_idle_path_prepares_and_runs_in_one_hop_with_the_same_outcomes(
    inproc: Any,
) -> None:
    """A lone one-input job on an idle worker is prepared in the model thread that runs it
    (one hop, not two), and ends as the scheduled path would end it: a result, a model
    error, an input the model cannot take. Under load the scheduled path runs (a prepare
    thread, then a model thread)."""
    model = ThreadRecorder()
    w = inproc(model)
    await w.start()
    ok = await w.submit("quiet")
    assert (await w.final(ok)).outputs is not None
    assert model.prepared_in == ["inferq-model"] and model.ran_in == ["inferq-model"]
    boom = await w.submit("boom")
    failed = await w.final(boom)
    assert failed.status is Status.FAILED and failed.error is not None
    assert failed.error.code == ErrorCode.MODEL_ERROR and "boom" in failed.error.message
    job = Job(id=new_job_id("echo"), model="echo", inputs=[{"image": b"\xff\xd8\xff"}])
    assert (await w.queue.submit(job)).outcome == "created"
    bad = await w.final(job.id)
    assert bad.error is not None and bad.error.code == ErrorCode.INVALID_INPUT
    # Two inputs: the scheduled path, prepared in the prepare thread.
    model.prepared_in.clear()
    pair = await w.submit("one", "two")
    assert (await w.final(pair)).status is Status.SUCCEEDED
    assert model.prepared_in == ["inferq-prepare"]


async def _status(w: InProcess, job_id: str, status: Status) -> bool:
    job = await w.queue.get(job_id)
    return job is not None and job.status is status


async def test_results_are_kept_through_a_redis_outage_and_posted_after(
    inproc: Any, redis_server: Any
) -> None:
    proxy = Proxy(redis_server.port)
    await proxy.start()
    model = Recorder()
    model.gate.clear()
    w = inproc(model, worker_url=proxy.url)
    job_id = await w.submit("computed while redis is away")
    worker = await w.start()
    await until(model.entered.is_set, 10, "the batch on the device")
    await proxy.cut()
    model.gate.set()  # the result is ready while the worker cannot reach Redis
    await until(lambda: worker.outbox.unavailable_since is not None, 10, "a failed post")
    assert worker.outbox.pending >= 1
    assert (await w.queue.get(job_id)).status is Status.RUNNING  # type: ignore[union-attr]
    pubsub = w.admin.pubsub()
    await pubsub.subscribe(keys.done_channel(job_id))
    await proxy.restore()
    job = await w.final(job_id, timeout_s=20)
    assert job.status is Status.SUCCEEDED
    assert job.outputs is not None
    assert job.outputs.tolist() == [expected_vector("computed while redis is away")]
    await until(lambda: worker.outbox.pending == 0, 10, "the outbox to empty")
    messages = []
    for _ in range(10):
        m = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if m is not None:
            messages.append(m)
    assert len(messages) == 1  # published once, after the outage
    await pubsub.aclose()
    await w.close()
    await proxy.close()


async def test_a_deadline_that_passes_on_the_fake_clock_expires_a_held_job(inproc: Any) -> None:
    clock = FakeClock()
    model = Recorder()
    model.gate.clear()
    w = inproc(model, clock=clock, max_batch_size=1, prefetch_items=8)
    busy = await w.submit("keeps the device busy")
    worker = await w.start()
    await until(model.entered.is_set, 10, "the first batch on the device")
    # Submitted now with a 5 s deadline on the worker's clock; nothing is waited for.
    late = await w.submit("never runs", deadline_ms=clock.now_ms() + 5000)  # timeout_s=5
    await until(lambda: worker.book.knows(late), 10, "the second job held")
    clock.advance(6)
    model.gate.set()  # the busy batch ends; the worker re-checks deadlines before the next
    job = await w.final(late)
    assert job.status is Status.EXPIRED and job.error is not None
    assert job.error.code == ErrorCode.EXPIRED
    assert (await w.final(busy)).status is Status.SUCCEEDED
    assert w.model.ran("never runs") == []


async def test_a_restarted_worker_reads_new_jobs_while_it_holds_its_old_pending_list(
    inproc: Any,
) -> None:
    """A worker that crashed leaves its entries in its pending list; restarted under the same
    name it takes them back first. Those entries stay there until their jobs finish, so its
    next read must be of new entries: it used to re-read the pending list, without blocking,
    until every old job had finished, and read nothing new in the meantime."""
    first = Recorder()
    first.gate.clear()
    w1 = inproc(first, max_batch_size=1, prefetch_items=10)
    old = [await w1.submit(f"old {i}") for i in range(3)]
    crashed = await w1.start()
    await until(lambda: crashed.book.held_items() == 3, 10, "three jobs held")
    w1.task.cancel()  # a crash: no drain, no hand-back; the entries stay in its pending list
    with contextlib.suppress(asyncio.CancelledError):
        await w1.task
    model = Recorder()
    model.gate.clear()  # the old jobs stay held by the restarted worker
    w2 = inproc(model, max_batch_size=1, prefetch_items=10)
    worker = await w2.start()
    await until(lambda: all(worker.book.knows(j) for j in old), 10, "the old jobs taken back")
    new = await w2.submit("new")
    await until(lambda: worker.book.knows(new), 10, "the new job read beside them")
    model.gate.set()
    first.gate.set()
    for j in [*old, new]:
        assert (await w2.final(j)).status is Status.SUCCEEDED
