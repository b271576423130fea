"""The API's completion subscriber, and the wait that uses it, on fakeredis pub/sub."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import fakeredis
import pytest

from inferq.api.core import service as service_module
from inferq.api.core.admission import Admission, ModelCatalog, RedisMemory
from inferq.api.core.cache import ResultCache
from inferq.api.core.service import Checks, JobService
from inferq.api.webhooks.contract import submit_target
from inferq.shared import keys
from inferq.shared import producer as notifier_module
from inferq.shared.jobs import Job, Status, encode_final, encode_submit
from inferq.shared.metrics import api_metrics
from inferq.shared.producer import Notifier
from inferq.shared.registry import WorkerRegistry
from inferq.shared.settings import Settings
from tests.queues import JobQueue


@pytest.fixture
async def parts() -> AsyncIterator[tuple[Notifier, fakeredis.FakeAsyncRedis]]:
    server = fakeredis.FakeServer()
    n = Notifier(fakeredis.FakeAsyncRedis(server=server))
    await n.start()
    await asyncio.wait_for(n.connected.wait(), 5)
    r = fakeredis.FakeAsyncRedis(server=server)
    try:
        yield n, r
    finally:
        await n.close()
        await r.aclose()


async def test_watch_then_done_resolves(parts: tuple[Notifier, fakeredis.FakeAsyncRedis]) -> None:
    n, r = parts
    fut = n.watch("j1")
    assert not fut.done()
    await r.publish(keys.done_channel("j1", n.listener), "final")
    await asyncio.wait_for(fut, 5)
    assert n.waiting == 0


async def test_only_completions_sent_to_this_process_are_heard(
    parts: tuple[Notifier, fakeredis.FakeAsyncRedis],
) -> None:
    """Each API process hears the jobs whose record names it (`listeners`), not every
    job's: another process's completions and unaddressed ones never reach its waiters."""
    n, r = parts
    other = Notifier(fakeredis.FakeAsyncRedis())
    assert other.listener != n.listener
    fut, mine = n.watch("x"), n.watch("mine")
    await r.publish(keys.done_channel("x", other.listener), "final")
    await r.publish(keys.done_channel("x"), "final")
    await r.publish(keys.done_channel("mine", n.listener), "final")
    await asyncio.wait_for(mine, 5)  # handled in order: the two before it were not for us
    assert not fut.done() and n.waiting == 1
    await other._redis.aclose()


async def test_done_before_watch_is_remembered(
    parts: tuple[Notifier, fakeredis.FakeAsyncRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    n, r = parts
    monkeypatch.setattr(notifier_module, "RECENT", 3)
    other = n.watch("other")  # a message for it proves the ones before were handled
    for job_id in ("a", "b", "c", "d", "other"):
        await r.publish(keys.done_channel(job_id, n.listener), "final")
    await asyncio.wait_for(other, 5)
    assert [n.watch(j).done() for j in ("a", "b", "c", "d", "never")] == [
        False,
        False,
        True,
        True,
        False,
    ]  # fmt: skip  (only the last RECENT=3 completions: c, d, other)


def _service(n: Notifier, r: fakeredis.FakeAsyncRedis) -> JobService:
    settings, metrics = Settings(_env_file=None), api_metrics()
    checks = Checks(
        catalog=ModelCatalog(settings, WorkerRegistry(r)),
        admission=Admission(settings.max_queue, settings.max_queue_bytes),
        cache=ResultCache(settings, r),
        memory=RedisMemory(r, settings.redis_memory_high_water, metrics),
        webhook_target=submit_target,
    )
    return JobService(settings, JobQueue(r, result_ttl_s=60), n, metrics, checks)


def _count_reads(service: JobService) -> list[str]:
    """The ids `service` reads from Redis from now on, in order."""
    reads: list[str] = []
    real_get = service.get

    async def counting_get(job_id: str, tenant: str = "", *, listen: bool = False) -> Job:
        reads.append(job_id)
        return await real_get(job_id, tenant, listen=listen)

    service.get = counting_get  # type: ignore[method-assign]
    return reads


async def test_wait_after_submit_skips_the_first_read(
    parts: tuple[Notifier, fakeredis.FakeAsyncRedis],
) -> None:
    n, r = parts
    service = _service(n, r)
    reads = _count_reads(service)
    job = Job(id="j2", model="echo", inputs=["x"])
    await r.hset(keys.job("j2"), mapping=encode_submit(job))
    queued = await service.wait("j2", 0.0, submitted=job)
    assert queued is job and reads == []  # no wait: the submitted state, no Redis read

    waiter = asyncio.ensure_future(service.wait("j2", 5.0, submitted=job))
    await r.hset(keys.job("j2"), mapping=encode_final(Status.SUCCEEDED, finished_ms=1))
    await r.publish(keys.done_channel("j2", n.listener), "final")
    done = await asyncio.wait_for(waiter, 5)
    assert done.status is Status.SUCCEEDED and reads == ["j2"]  # one read: the final one


async def test_a_sync_wait_ends_with_the_client_or_the_job_whichever_comes_first(
    parts: tuple[Notifier, fakeredis.FakeAsyncRedis],
) -> None:
    """`follow` races the completion against the client's leaving in the request's own task:
    None once the client left (the job still queued), the job once it is final, and the job
    too when both happen before the request's task runs again."""
    n, r = parts
    service = _service(n, r)
    left, watching = asyncio.Event(), asyncio.Event()
    watched: list[str] = []

    async def gone() -> None:
        watched.append("watching")
        watching.set()
        try:
            await left.wait()
        finally:
            watched.append("stopped")

    async def start(job_id: str) -> asyncio.Future[Job | None]:
        """`follow` under way for a new queued job, its disconnect watch up: it waits."""
        left.clear()
        watching.clear()
        watched.clear()
        job = Job(id=job_id, model="echo", inputs=["x"])
        await r.hset(keys.job(job_id), mapping=encode_submit(job))
        running = asyncio.ensure_future(service.follow(job, False, "", 5.0, gone))
        await asyncio.wait_for(watching.wait(), 5)
        return running

    async def succeed(job_id: str) -> None:
        await r.hset(keys.job(job_id), mapping=encode_final(Status.SUCCEEDED, finished_ms=1))

    # The client leaves: None, while the job is still queued.
    running = await start("a")
    left.set()
    assert await asyncio.wait_for(running, 5) is None
    assert watched == ["watching", "stopped"]

    # The job ends first: the job, and the disconnect watch is stopped.
    running = await start("b")
    await succeed("b")
    await r.publish(keys.done_channel("b", n.listener), "final")
    done = await asyncio.wait_for(running, 5)
    assert done is not None and done.status is Status.SUCCEEDED
    await asyncio.sleep(0)  # the cancelled watch runs its `finally`
    assert watched == ["watching", "stopped"]

    # Both in one turn, while the request waits: the completion wins.
    running = await start("c")
    await succeed("c")
    left.set()
    n._wake("c")  # the completion message, as the listener hands it on (no payload: re-read)
    done = await asyncio.wait_for(running, 5)
    assert done is not None and done.status is Status.SUCCEEDED


async def test_a_quick_answer_never_watches_its_client_and_a_slow_one_does(
    parts: tuple[Notifier, fakeredis.FakeAsyncRedis],
) -> None:
    """`follow` starts the disconnect watch only once the wait outlives
    `WATCH_CLIENT_AFTER_S`: a job answered sooner never calls `gone`, and a client that left
    during that time still ends the wait (None) once it is watched, with no read in between."""
    n, r = parts
    service = _service(n, r)
    calls: list[str] = []
    reads = _count_reads(service)

    async def already_left() -> None:
        calls.append("gone")  # the server kept the disconnect: this returns at once

    quick = Job(id="q", model="echo", inputs=["x"])
    await r.hset(keys.job("q"), mapping=encode_submit(quick))
    running = asyncio.ensure_future(service.follow(quick, True, "", 5.0, already_left))
    await asyncio.sleep(0.01)
    await r.hset(keys.job("q"), mapping=encode_final(Status.SUCCEEDED, finished_ms=1))
    await r.publish(keys.done_channel("q", n.listener), "final")
    done = await asyncio.wait_for(running, 5)
    assert done is not None and done.status is Status.SUCCEEDED
    assert calls == [] and reads == ["q"]  # never watched; read once, for the final state

    slow = Job(id="s", model="echo", inputs=["x"])  # a repeat's job: read first, never cancelled
    await r.hset(keys.job("s"), mapping=encode_submit(slow))
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await asyncio.wait_for(service.follow(slow, False, "", 5.0, already_left), 5) is None
    assert loop.time() - began >= service_module.WATCH_CLIENT_AFTER_S
    assert calls == ["gone"] and service_module.WATCH_CLIENT_AFTER_S == 0.2  # docs/api.md
    assert reads == ["q", "s"]  # the repeat's first read; none when the watch starts
