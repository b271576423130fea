"""The API's completion subscriber, and the wait that uses it, on fakeredis pub/sub."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import fakeredis
import pytest

from inferq.api.core import notifier as notifier_module
from inferq.api.core.admission import Admission
from inferq.api.core.cache import ResultCache
from inferq.api.core.catalog import ModelCatalog
from inferq.api.core.notifier import Notifier
from inferq.api.core.redis_memory import RedisMemory
from inferq.api.core.service import Checks, JobService
from inferq.api.webhooks.contract import submit_target
from inferq.shared import keys
from inferq.shared.jobs import Job, Status, encode_final, encode_submit
from inferq.shared.metrics import api_metrics
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
    await r.publish(keys.done_channel("j1"), "final")
    await asyncio.wait_for(fut, 5)
    assert n.waiting == 0


async def test_done_before_watch_is_remembered(
    parts: tuple[Notifier, fakeredis.FakeAsyncRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    n, r = parts
    monkeypatch.setattr(notifier_module, "RECENT", 3)
    other = n.watch("other")  # a message for it proves the ones before were handled
    for job_id in ("a", "b", "c", "d", "other"):
        await r.publish(keys.done_channel(job_id), "final")
    await asyncio.wait_for(other, 5)
    assert [n.watch(j).done() for j in ("a", "b", "c", "d", "never")] == [
        False,
        False,
        True,
        True,
        False,
    ]  # fmt: skip  (only the last RECENT=3 completions: c, d, other)


async def test_wait_after_submit_skips_the_first_read(
    parts: tuple[Notifier, fakeredis.FakeAsyncRedis],
) -> None:
    n, r = parts
    settings, metrics = Settings(_env_file=None), api_metrics()
    checks = Checks(
        catalog=ModelCatalog(settings, WorkerRegistry(r)),
        admission=Admission(settings.max_queue, settings.max_queue_bytes),
        cache=ResultCache(settings, r),
        memory=RedisMemory(r, settings.redis_memory_high_water, metrics),
        webhook_target=submit_target,
    )
    service = JobService(settings, JobQueue(r, result_ttl_s=60), n, metrics, checks)
    reads: list[str] = []
    real_get = service.get

    async def counting_get(job_id: str, tenant: str = "") -> Job:
        reads.append(job_id)
        return await real_get(job_id, tenant)

    service.get = counting_get  # type: ignore[method-assign]
    job = Job(id="j2", model="echo", inputs=["x"])
    await r.hset(keys.job("j2"), mapping=encode_submit(job))
    queued = await service.wait("j2", 0.0, submitted=job)
    assert queued is job and reads == []  # no wait: the submitted state, no Redis read

    waiter = asyncio.ensure_future(service.wait("j2", 5.0, submitted=job))
    await r.hset(keys.job("j2"), mapping=encode_final(Status.SUCCEEDED, finished_ms=1))
    await r.publish(keys.done_channel("j2"), "final")
    done = await asyncio.wait_for(waiter, 5)
    assert done.status is Status.SUCCEEDED and reads == ["j2"]  # one read: the final one
