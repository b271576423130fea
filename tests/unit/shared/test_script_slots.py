"""Every queue script call names keys of one slot (what a Redis Cluster demands), for jobs
spread over several shards; checked on the real key names with redis-py's CRC16."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest
from redis.crc import key_slot

from inferq.shared import keys
from inferq.shared.jobs import Job, new_job_id
from inferq.shared.queue import Entry, Final, Idempotency
from tests.queues import JobQueue

SHARDS = 3


class Spy:
    """Stands in for a registered script: records the keys of each call, answers plausibly."""

    def __init__(self, name: str, calls: list[tuple[str, list[str]]]) -> None:
        self.name, self.calls = name, calls

    async def __call__(
        self, keys: list[str], args: list[Any] | None = None, client: Any = None
    ) -> Any:
        assert client is None, f"{self.name} queued on a pipeline: a cluster refuses that"
        self.calls.append((self.name, list(keys)))
        if self.name == "submit":
            return [b"ok", b"1-0"]
        if self.name == "cached":
            return [b"ok", b""]
        if self.name in ("claim",):
            return [[] for _ in keys]
        if self.name == "start":
            return [[b"", 0] for _ in keys]
        if self.name == "finish":
            return [1 for k in keys if k.startswith(f"{keys[0].split(':')[0]}:job:")]
        if self.name == "request_cancel":
            return b"running"
        return 1


@pytest.fixture
def spied() -> tuple[JobQueue, list[tuple[str, list[str]]]]:
    q = JobQueue(fakeredis.aioredis.FakeRedis(), result_ttl_s=60, shards=SHARDS)
    q.cluster = True  # group per shard as on a cluster
    calls: list[tuple[str, list[str]]] = []
    for name in ("submit", "claim", "finish", "hand_back", "start", "cached", "request_cancel"):
        setattr(q, f"_{name}", Spy(name, calls))
    return q, calls


def test_every_script_call_stays_in_one_slot(spied: tuple[JobQueue, list[Any]]) -> None:
    q, calls = spied
    jobs = [
        Job(id=new_job_id("echo", s % SHARDS, SHARDS), model="echo", inputs=["x"], priority=lane)
        for s, lane in zip(range(9), ["high", "normal", "low"] * 3, strict=True)
    ]

    async def run() -> None:
        for j in jobs:
            await q.submit(j, idempotency=Idempotency("k" + j.id))
            await q.record_cached(j, {"status": b"x"}, idempotency=Idempotency("k" + j.id))
        ids = [j.id for j in jobs]
        await q.claim(ids, 1)
        await q.claim(ids, 1, start_limit=3)
        await q.start(ids, [True] * len(ids), [0] * len(ids))
        entries = [
            Entry(
                keys.stream("echo", j.priority, int(keys.job_shard(j.id)[1]), SHARDS), "1-0", j.id
            )  # type: ignore[index]
            for j in jobs
        ]
        await q.finish(
            [Final("echo", e.stream, e.entry_id, e.job_id, {"a": b"1"}) for e in entries]
        )
        await q.hand_back(entries)
        await q.cancel(jobs[4], {"a": b"1"}, only_if_queued=True)
        await q.request_cancel(jobs[5].id)

    asyncio.run(run())
    assert {name for name, _ in calls} == {
        "submit",
        "claim",
        "finish",
        "hand_back",
        "start",
        "cached",
        "request_cancel",
    }
    for name, ks in calls:
        slots = {key_slot(k.encode()) for k in ks}
        assert len(slots) == 1, (name, ks)
    # The shards' slots differ: one call per shard for the batch calls.
    assert sum(1 for name, _ in calls if name == "claim") == 2 * SHARDS
    assert sum(1 for name, _ in calls if name == "finish") == SHARDS + 1  # + the cancel
