"""GET /v1/jobs on the real stack (an API, an echo worker, Redis), and the index under it.

The listing is tenant-scoped (an admin key lists every tenant's, or one's), newest first,
paged by `after`, filtered by status, model, creation time and metadata; `metadata` and
`result_ttl_s` ride on the job. The index (`keys.tenant_jobs`) is kept by the scripts that
make a job and follows the records' lifetime; a page's cost does not grow with the jobs held.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import redis

from inferq.api.core.listing import JobFilter, JobListing
from inferq.shared import keys
from inferq.shared.jobs import Job, Status, encode_final, new_job_id, now_ms
from inferq.shared.queue import Final
from tests.integration.stack import Stack, wait_for
from tests.queues import JobQueue

A, B, OPS = "key-a-0123456789", "key-b-0123456789", "key-ops-0123456789"
KEYS = {"api_keys": f"a:{A},b:{B}", "admin_keys": f"ops:{OPS}"}


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _submit(base: str, key: str, body: dict[str, Any]) -> str:
    r = httpx.post(f"{base}/v1/jobs", json=body, headers=_auth(key), timeout=10)
    assert r.status_code == 202, r.text
    return r.json()["id"]  # type: ignore[no-any-return]


def _list(base: str, key: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{base}/v1/jobs", params=params, headers=_auth(key), timeout=10)


def _page(base: str, key: str, **params: Any) -> dict[str, Any]:
    r = _list(base, key, **params)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _walk(base: str, key: str, **params: Any) -> list[str]:
    """Every id the listing gives, page by page."""
    ids: list[str] = []
    after: str | None = None
    for _ in range(100):
        page = _page(base, key, **params, **({"after": after} if after else {}))
        ids += [j["id"] for j in page["data"]]
        if not page["has_more"]:
            return ids
        after = page["last_id"]
    raise AssertionError("the listing never ended")


def test_tenants_list_their_own_jobs_newest_first_with_filters_and_pages(stack: Stack) -> None:
    stack.worker()
    base = stack.api(**KEYS)
    a_ids = [
        _submit(base, A, {"input": f"a{i}", "metadata": {"run": "r1" if i % 2 else "r2"}})
        for i in range(7)
    ]
    b_ids = [_submit(base, B, {"input": f"b{i}"}) for i in range(3)]
    for job_id, key in [(a_ids[-1], A), (b_ids[-1], B)]:
        r = httpx.get(f"{base}/v1/jobs/{job_id}?wait=10", headers=_auth(key), timeout=20)
        assert r.json()["status"] == "succeeded"

    first = _page(base, A, limit=3)
    assert first["object"] == "list" and first["has_more"] is True
    assert [j["id"] for j in first["data"]] == a_ids[::-1][:3]
    assert first["first_id"] == a_ids[-1] and first["last_id"] == a_ids[-3]
    assert "outputs" not in first["data"][0] and first["data"][0]["metadata"] == {"run": "r2"}
    assert _walk(base, A, limit=2) == a_ids[::-1]  # every job once, in order, across pages
    assert _walk(base, B, limit=2) == b_ids[::-1]
    # An admin sees every tenant's (merged newest first), or one tenant's.
    assert sorted(_walk(base, OPS, limit=4)) == sorted(a_ids + b_ids)
    assert _walk(base, OPS, tenant="b") == b_ids[::-1]
    assert _list(base, A, tenant="b").status_code == 403
    # Filters: metadata (all pairs must match), status, model, creation time.
    r1 = [i for n, i in enumerate(a_ids) if n % 2]
    assert _walk(base, A, **{"metadata[run]": "r1"}) == r1[::-1]
    assert _walk(base, A, **{"metadata[run]": "r1", "metadata[x]": "y"}) == []
    wait_for(lambda: _walk(base, A, status="succeeded") == a_ids[::-1], 20, "a's jobs to succeed")
    assert _walk(base, A, status="queued") == []
    assert _walk(base, A, model="echo") == a_ids[::-1]
    assert _list(base, A, model="nope").status_code == 404
    future = int(time.time()) + 3600
    assert _walk(base, A, created_after=future) == []
    assert _walk(base, A, created_before=future) == a_ids[::-1]
    # Outputs only when asked.
    full = _page(base, A, limit=1, include_outputs="true")["data"][0]
    assert full["outputs"] and full["created_at"] > 0
    # Refusals name the problem.
    assert _list(base, A, limit=0).status_code == 422
    assert _list(base, A, limit=101).status_code == 422
    assert _list(base, A, status="done").status_code == 422
    assert _list(base, A, after=b_ids[0]).status_code == 422  # not a's job
    assert _list(base, A, **{"metadata[]": "x"}).status_code == 422


def test_metadata_and_result_ttl_ride_on_the_job(stack: Stack) -> None:
    stack.worker()
    base = stack.api(result_ttl_max_s=600)
    r = httpx.post(
        f"{base}/v1/infer",
        json={"input": "x", "metadata": {"order": "o-17"}, "result_ttl_s": 30},
        timeout=20,
    )
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["metadata"] == {"order": "o-17"}
    ttl = stack.r.ttl(keys.job(view["id"]))
    assert 0 < ttl <= 30  # not the server's 3600
    for body, loc in [
        ({"input": "x", "result_ttl_s": 601}, "INFERQ_RESULT_TTL_MAX_S"),
        ({"input": "x", "result_ttl_s": 0}, "result_ttl_s"),
        ({"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"input": "x", "metadata": {"k": "v" * 513}}, "metadata.k"),
        ({"input": "x", "metadata": {"k": 1}}, "metadata.k"),
    ]:
        r = httpx.post(f"{base}/v1/jobs", json=body, timeout=10)
        assert r.status_code == 422 and loc in r.text, (body, r.text)
    assert stack.r.zcard(keys.tenant_jobs("echo", 0, 1, "")) == 1  # refusals leave nothing


def _job(model: str = "echo", tenant: str = "t", ttl: int = 0) -> Job:
    job = Job(id=new_job_id(model), model=model, inputs=["x"], tenant=tenant)
    job.result_ttl_s = ttl
    return job


async def _finish(queue: JobQueue, job: Job) -> None:
    fields = encode_final(Status.SUCCEEDED, finished_ms=now_ms(), outputs=[1])
    await queue.finish([Final(job.model, "", "", job.id, fields, tenant=job.tenant)])


async def test_the_index_follows_the_records_lifetime(queue: JobQueue, redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    index = keys.tenant_jobs("echo", 0, 1, "t")
    short = [_job(ttl=1) for _ in range(3)]
    for job in short:
        assert (await queue.submit(job)).outcome == "created"
        await _finish(queue, job)
    assert r.zcard(index) == 3
    wait_for(lambda: not any(r.exists(keys.job(j.id)) for j in short), 10, "records to expire")
    # A new job checks the two oldest (two of the three gone), then two at random of the two
    # members left: the last gone one and itself.
    await queue.submit(_job())
    assert r.zcard(index) == 1
    assert {m.decode() for m in r.zrange(index, 0, -1)}.isdisjoint(keys.job(j.id) for j in short)
    # A refused job leaves nothing behind.
    assert (await queue.submit(_job(), max_queue=0)).outcome == "full"
    assert r.zcard(index) == 1
    r.close()


async def test_brief_records_are_indexed_apart_so_long_ones_cannot_hold_them(
    redis_url: str,
) -> None:
    """Two jobs kept an hour are the oldest of their tenant's; jobs kept a second come after.
    In one index the two live records at its head would stop the trimming (a new job checks
    the two oldest); in an index of their own (INFERQ_SYNC_RESULT_TTL_S) the brief ones are
    trimmed as they expire, and a page still lists both kinds in one order."""
    from redis.asyncio import Redis

    conn = Redis.from_url(redis_url)
    queue, r = JobQueue(conn, result_ttl_s=3600, brief_ttl_s=1), redis.Redis.from_url(redis_url)
    long_index, brief_index = (keys.tenant_jobs("echo", 0, 1, "t", b) for b in (False, True))
    kept = [_job(), _job()]  # the default TTL: the hour
    briefs = [_job(ttl=1) for _ in range(3)]
    for i, job in enumerate([*kept, *briefs]):
        job.created_ms += i  # one order, whatever the clock did
        assert (await queue.submit(job)).outcome == "created"
        await _finish(queue, job)
    assert r.zcard(long_index) == 2 and r.zcard(brief_index) == 3
    page = await JobListing(conn, ["echo"], 1).page(["t"], JobFilter(), limit=10)
    assert [j.id for j in page.jobs] == [j.id for j in [*kept, *briefs][::-1]]
    wait_for(lambda: not any(r.exists(keys.job(j.id)) for j in briefs), 10, "records to expire")
    await queue.submit(_job(ttl=1))  # drops the two oldest gone, then the last (at random)
    members = {m.decode() for m in r.zrange(brief_index, 0, -1)}
    assert len(members) == 1 and members.isdisjoint(keys.job(j.id) for j in briefs)
    assert r.zcard(long_index) == 2  # the hour's jobs, untouched
    await queue.submit(_job(ttl=600))  # a TTL of its own, not the brief one: with the rest
    assert r.zcard(long_index) == 3
    r.close()
    await conn.aclose()


async def test_gone_members_behind_a_long_lived_head_are_found_at_random(
    queue: JobQueue, redis_url: str
) -> None:
    """Two jobs kept days head the index and 100 short-lived ones expire behind them: the
    oldest-two check finds nothing to drop, and the two members each new job checks at
    random find them (2 × their share a submit: after 200 submits about 3 are left, and in
    20,000 simulated runs never more than 12)."""
    r = redis.Redis.from_url(redis_url)
    index = keys.tenant_jobs("echo", 0, 1, "t")
    short = [_job(ttl=1) for _ in range(100)]
    for i, job in enumerate([_job(ttl=7 * 86_400), _job(ttl=7 * 86_400), *short]):
        job.created_ms += i  # the long-lived two are the oldest
        assert (await queue.submit(job)).outcome == "created"
        await _finish(queue, job)
    wait_for(lambda: not any(r.exists(keys.job(j.id)) for j in short), 10, "records to expire")
    for _ in range(200):
        await queue.submit(_job())
    members = r.zrange(index, 0, -1)
    gone = sum(1 for m in members if not r.exists(m))
    assert gone < 50, gone
    assert len(members) - gone == 202  # every live one is still listed
    r.close()


async def test_a_page_reads_the_same_whatever_the_jobs_held(
    queue: JobQueue, redis_url: str
) -> None:
    """Bounded cost, counted rather than timed: a page of 20 makes the same Redis calls with
    100 jobs and with 3,000 held, and never a SCAN (scripts/list_cost.py times it)."""
    r = redis.Redis.from_url(redis_url)
    listing = JobListing(queue.redis, ["echo"], 1)

    def calls() -> int:
        stats = r.info("commandstats")
        assert not any("scan" in name for name in stats)
        return sum(int(v["calls"]) for v in stats.values())

    async def page_cost() -> int:
        await queue.redis.ping()  # connected: a first connect's handshake is not the page's
        r.config_resetstat()
        page = await listing.page(["t"], JobFilter(), limit=20)
        assert len(page.jobs) == 20 and page.has_more
        return calls()

    async def fill(n: int) -> None:
        for _ in range(n):
            await queue.submit(_job())

    await fill(100)
    small = await page_cost()
    await fill(2900)
    assert await page_cost() == small
    r.close()


@pytest.mark.parametrize("shards", [1, 3])
async def test_pages_merge_shards_and_tied_times_in_one_order(redis_url: str, shards: int) -> None:
    """Jobs made in the same millisecond, on several shards: each listed once, in order."""
    assert keys.job_id_of(keys.job("echo.1~3.abc")) == "echo.1~3.abc"
    assert keys.job_id_of(keys.job("plain")) == "plain"
    from redis.asyncio import Redis

    conn = Redis.from_url(redis_url)
    queue = JobQueue(conn, result_ttl_s=60, shards=shards)
    made: list[Job] = []
    for i in range(40):
        job = Job(id=new_job_id("echo", i % shards, shards), model="echo", inputs=["x"])
        job.tenant, job.created_ms = "t", 1_000_000 + i // 7  # runs of 7 share a ms
        assert (await queue.submit(job)).outcome == "created"
        made.append(job)
    listing = JobListing(conn, ["echo"], shards)
    # Ties in a millisecond go by record key (what the index holds), the same everywhere.
    want = [j.id for j in sorted(made, key=lambda j: (j.created_ms, keys.job(j.id)), reverse=True)]
    got: list[str] = []
    after: str | None = None
    while True:
        page = await listing.page(["t"], JobFilter(), limit=6, after=after)
        got += [j.id for j in page.jobs]
        if not page.has_more:
            break
        after = page.last_id
    assert got == want
    page = await listing.page(["t"], JobFilter(status=Status.SUCCEEDED), limit=5)
    assert page.jobs == [] and not page.has_more
    await conn.aclose()


def test_the_client_lists_and_labels_jobs(stack: Stack) -> None:
    from inferq.client import Client

    stack.worker()
    base = stack.api()
    with Client(base) as client:
        made = [client.infer(input=f"t{i}", metadata={"n": str(i % 2)}) for i in range(5)]
        queued = client.submit(input="late", result_ttl_s=60, metadata={"n": "1"})
        client.wait(queued.id, timeout_s=20)
        listed = list(client.jobs(page_size=2))
        assert [j.id for j in listed] == [queued.id] + [j.id for j in made[::-1]]
        assert all(j.outputs is None and j.created_at for j in listed)
        odd = list(client.jobs(metadata={"n": "1"}, include_outputs=True, page_size=2))
        assert [j.id for j in odd] == [queued.id, made[3].id, made[1].id]
        assert all(j.metadata == {"n": "1"} and j.outputs is not None for j in odd)
        assert list(client.jobs(status="failed")) == []
