"""The queue's Lua scripts against a real Redis: atomic, retry-safe, never clobbering."""

from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from inferq.redis_server import free_port
from inferq.shared import keys
from inferq.shared.errors import QueueUnavailable
from inferq.shared.jobs import (
    Job,
    JobError,
    Status,
    decode_published,
    encode_final,
    encode_submit,
    published_job,
)
from inferq.shared.queue import Final, Idempotency, Submitted
from inferq.shared.schema import DeliveryField, JobField
from tests.queues import JobQueue


async def test_submit_is_idempotent_per_job_id(queue: JobQueue) -> None:
    job = Job(id="j1", model="echo", inputs=["a"])
    assert (await queue.submit(job)).outcome == "created"
    again = await queue.submit(job)  # a client-side retry adds no second entry
    assert (again.outcome, again.job_id) == ("duplicate", "j1")
    assert await queue.queue_depth("echo") == 1
    assert await queue.queued_items("echo") == 1
    got = await queue.get("j1")
    assert got is not None and got.status is Status.QUEUED and got.inputs == ["a"]


async def test_claim_marks_running_once_and_start_counts_attempts(queue: JobQueue) -> None:
    await queue.ensure_group("echo")
    await queue.ensure_group("echo")  # BUSYGROUP is fine
    await queue.submit(Job(id="j2", model="echo", inputs=["a"]))
    entries = await queue.read("echo", "c1", count=10, block_ms=100)
    assert [e.job_id for e in entries] == ["j2"]
    (c,) = await queue.claim(["j2"], 123)
    assert c is not None and not c.started
    assert c.job.status is Status.RUNNING and c.job.started_ms == 123
    (again,) = await queue.claim(["j2"], 456)  # a redelivery keeps the first start time
    assert again is not None and again.job.started_ms == 123 and again.job.attempts == 0
    # attempts count device starts: only the first start in a worker counts
    assert await queue.start(["j2"], [True], [0]) == [(b"\xa7running", False)]
    await queue.start(["j2"], [False], [0])
    (started,) = await queue.claim(["j2"], 789)
    assert started is not None and started.job.attempts == 1
    assert await queue.claim(["missing"], 1) == [None]
    # own PEL is readable with '0' until acked
    assert [
        e.job_id for e in await queue.read("echo", "c1", count=10, block_ms=None, pending=True)
    ] == ["j2"]


async def test_a_claim_that_starts_counts_only_a_lone_runnable_item(queue: JobQueue) -> None:
    """An idle worker's claim of one job counts its device start (START is skipped): but
    never for a job of several items, one already at the delivery limit, one past its
    deadline, or a final one; the record returned is the one before the count."""
    now = 1_000_000
    jobs = {
        "lone": Job(id="lone", model="echo", inputs=["a"]),
        "two": Job(id="two", model="echo", inputs=["a", "b"]),
        "limit": Job(id="limit", model="echo", inputs=["a"], attempts=3),
        "late": Job(id="late", model="echo", inputs=["a"], deadline_ms=now - 1),
        "fresh": Job(id="fresh", model="echo", inputs=["a"], deadline_ms=now + 1),
    }
    for j in jobs.values():
        await queue.submit(j)
    claimed = await queue.claim(list(jobs), now, start_limit=3)
    assert [c and c.started for c in claimed] == [True, False, False, False, True]
    assert [c and c.job.attempts for c in claimed] == [0, 0, 3, 0, 0]  # before the count
    after = {k: await queue.get(k) for k in jobs}
    assert {k: j and j.attempts for k, j in after.items()} == {
        "lone": 1, "two": 0, "limit": 3, "late": 0, "fresh": 1
    }  # fmt: skip
    assert all(j and j.status is Status.RUNNING for j in after.values())
    # A redelivered claim counts again only if asked to; a plain claim never counts.
    (plain,) = await queue.claim(["lone"], now)
    assert plain is not None and not plain.started and plain.job.attempts == 1
    cancelled = encode_final(Status.CANCELLED, finished_ms=6, error=JobError("cancelled", "x"))
    assert await queue.cancel(jobs["fresh"], cancelled, only_if_queued=False) == 1
    (final,) = await queue.claim(["fresh"], now, start_limit=3)
    assert final is not None and not final.started and final.job.status is Status.CANCELLED


async def test_final_write_is_never_overwritten_and_acks(queue: JobQueue) -> None:
    await queue.ensure_group("echo")
    await queue.submit(Job(id="j3", model="echo", inputs=["a"]))
    (entry,) = await queue.read("echo", "c1", count=1, block_ms=100)
    ok = encode_final(Status.SUCCEEDED, finished_ms=1, outputs=np.ones((1, 4), np.float32))
    bad = encode_final(Status.FAILED, finished_ms=2, error=JobError("model_error", "late dup"))
    pubsub = queue.redis.pubsub()
    await pubsub.subscribe(keys.done_channel("j3"))
    assert await queue.finish([Final("echo", entry.stream, entry.entry_id, "j3", ok)]) == [1]
    assert await queue.finish([Final("echo", entry.stream, entry.entry_id, "j3", bad)]) == [0]
    assert await queue.queued_items("echo") == 0  # released once, not twice
    job = await queue.get("j3")
    assert job is not None and job.status is Status.SUCCEEDED and job.error is None
    assert 0 < await queue.redis.ttl(keys.job("j3")) <= 60
    assert await queue.queue_depth("echo") == 0  # acked and deleted
    assert await queue.read("echo", "c1", count=10, block_ms=None, pending=True) == []
    messages = []
    for _ in range(5):  # the first read may be the subscribe confirmation, which is skipped
        m = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if m is not None:
            messages.append(m)
    assert len(messages) == 1  # published once, not on the duplicate
    await pubsub.aclose()
    assert await queue.finish([Final("echo", entry.stream, "0-1", "gone", ok)]) == [-1]


async def test_keep_gives_a_brief_record_the_default_ttl_before_or_after_it_ends(
    queue: JobQueue,
) -> None:
    queue = JobQueue(queue.redis, result_ttl_s=60, brief_ttl_s=5)
    await queue.ensure_group("echo")
    jobs = {job_id: Job(id=job_id, model="echo", inputs=["a"]) for job_id in ("ended", "running")}
    for job in jobs.values():
        job.result_ttl_s = 5
        await queue.submit(job)
    default, brief = (keys.tenant_jobs("echo", 0, 1, "", b) for b in (False, True))
    assert await queue.redis.zcard(brief) == 2 and await queue.redis.zcard(default) == 0
    ok = encode_final(Status.SUCCEEDED, finished_ms=1, outputs=[1])
    assert await queue.finish([Final("echo", "", "", "ended", ok)]) == [1]
    assert 0 < await queue.redis.ttl(keys.job("ended")) <= 5
    await queue.keep(jobs["ended"])  # final: its TTL changes now
    assert 5 < await queue.redis.ttl(keys.job("ended")) <= 60
    await queue.keep(jobs["running"])  # not yet: FINISH finds no TTL of its own: the default
    assert await queue.redis.ttl(keys.job("running")) == -1  # a live record never expires
    assert await queue.finish([Final("echo", "", "", "running", ok)]) == [1]
    assert 5 < await queue.redis.ttl(keys.job("running")) <= 60
    # Both moved to the default index, at the time they were made.
    moved = await queue.redis.zrange(default, 0, -1, withscores=True)
    assert {(k.decode(), s) for k, s in moved} == {
        (keys.job(j.id), float(j.created_ms)) for j in jobs.values()
    }
    assert await queue.redis.zcard(brief) == 0
    await queue.keep(Job(id="gone", model="echo", inputs=["a"]))  # expired meanwhile: no error
    assert not await queue.redis.exists(keys.job("gone"))


async def _heard(pubsub: PubSub, n: int) -> list[tuple[str, bytes]]:
    """The next messages on `pubsub`, (channel, data), until `n` came or nothing more did
    within a short wait."""
    heard: list[tuple[str, bytes]] = []
    misses = 0
    while len(heard) < n and misses < 5:
        m = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if m is None:
            misses += 1
        else:
            heard.append((m["channel"].decode(), m["data"]))
    return heard


async def test_finish_tells_the_processes_the_record_names_and_listen_adds_one(
    queue: JobQueue,
) -> None:
    """A job submitted by an API process names it (`listeners`): FINISH publishes to it
    alone. LISTEN adds a reader once, only while the job is not final, and returns the
    record; a job that names nobody is published unaddressed."""
    await queue.ensure_group("echo")
    api = JobQueue(queue.redis, result_ttl_s=60, listener="a1")
    other = JobQueue(queue.redis, result_ttl_s=60, listener="b2")
    await api.submit(Job(id="t1", model="echo", inputs=["x"]))
    await queue.submit(Job(id="t2", model="echo", inputs=["x"]))  # no listener: a tool's
    pubsub = queue.redis.pubsub()
    await pubsub.psubscribe(keys.DONE_PATTERN)
    for _ in range(2):  # a second LISTEN by the same process adds nothing
        job = await other.get("t1", listen=True)
        assert job is not None and job.status is Status.QUEUED and job.inputs == ["x"]
    raw = await queue.redis.hget(keys.job("t1"), JobField.LISTENERS)
    assert raw is not None and msgpack.unpackb(raw) == "a1 b2"
    ok = encode_final(Status.SUCCEEDED, finished_ms=1, outputs=[1])
    entries = await queue.read("echo", "c1", count=10, block_ms=100)
    finals = [Final("echo", e.stream, e.entry_id, e.job_id, ok) for e in entries]
    assert await queue.finish(finals) == [1, 1]
    heard = await _heard(pubsub, 4)
    assert sorted(c for c, _ in heard) == sorted(
        [keys.done_channel("t1", "a1"), keys.done_channel("t1", "b2"), keys.done_channel("t2")]
    )
    queued = Job(id="t1", model="echo", inputs=["x"])
    assert all(published_job(data, queued) is not None for _, data in heard)
    # Final: a LISTEN reads it and adds nobody (FINISH has published already).
    late = JobQueue(queue.redis, result_ttl_s=60, listener="c3")
    final = await late.get("t1", listen=True)
    assert final is not None and final.status is Status.SUCCEEDED
    assert msgpack.unpackb(await queue.redis.hget(keys.job("t1"), JobField.LISTENERS)) == "a1 b2"
    assert await late.get("gone", listen=True) is None
    assert not await queue.redis.exists(keys.job("gone"))  # never made by a LISTEN
    await pubsub.aclose()


async def test_listen_names_at_most_sixteen_processes(queue: JobQueue) -> None:
    await queue.submit(Job(id="t3", model="echo", inputs=["x"]))
    for i in range(20):
        await JobQueue(queue.redis, result_ttl_s=60, listener=f"p{i}").get("t3", listen=True)
    raw = await queue.redis.hget(keys.job("t3"), JobField.LISTENERS)
    assert raw is not None and msgpack.unpackb(raw).split() == [f"p{i}" for i in range(16)]


@pytest.mark.parametrize("width", [4, 24 * 384])  # 32 B of outputs, 72 KiB
@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
async def test_the_completion_message_over_the_queued_job_is_the_final_record(
    queue: JobQueue, width: int, outcome: str
) -> None:
    """FINISH publishes what it wrote and what the worker wrote while the job ran (started,
    attempts, progress), never the record read back: laid over the job as its submitter
    holds it, that is the stored final record, less its inputs, field for field."""
    await queue.ensure_group("echo")
    submitted = Job(id="m1", model="echo", inputs=["a", "b"], tenant="t", metadata={"k": "v"})
    await queue.submit(submitted)
    (entry,) = await queue.read("echo", "c1", count=1, block_ms=100)
    await queue.claim(["m1"], 1234)
    await queue.start(["m1"], [True], [1])  # one device start, one input done
    out = np.arange(2 * width, dtype=np.float32).reshape(2, width)
    ok = outcome == "succeeded"
    fields = encode_final(
        Status.SUCCEEDED if ok else Status.FAILED,
        finished_ms=5678,
        outputs=out if ok else None,
        error=None if ok else JobError("model_error", "boom"),
        batch=(2, 9),
        worker="w1",
    )
    pubsub = queue.redis.pubsub()
    await pubsub.subscribe(keys.done_channel("m1"))
    assert await queue.finish([Final("echo", entry.stream, entry.entry_id, "m1", fields)]) == [1]
    message = None
    for _ in range(5):  # the first read may be the subscribe confirmation, which is skipped
        message = message or await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
    await pubsub.aclose()
    assert message is not None
    flat = msgpack.unpackb(message["data"], raw=True)
    progress = {JobField.STARTED_MS, JobField.ATTEMPTS, JobField.ITEMS_DONE}
    assert {k.decode() for k in flat[::2]} == set(fields) | progress  # nothing else is read
    job = published_job(message["data"], submitted)
    stored = await queue.get("m1")
    assert job is not None and stored is not None and stored.inputs == [] and job.inputs == []
    assert (job.started_ms, job.attempts, job.items_done) == (1234, 1, 1)
    for name in (
        "status",
        "started_ms",
        "finished_ms",
        "attempts",
        "items_done",
        "batch_size",
        "batch_tokens",
        "worker",
        "error",
        "tenant",
        "metadata",
        "items",
        "created_ms",
    ):
        assert getattr(job, name) == getattr(stored, name), name
    assert job.timings() == stored.timings()
    if ok:
        assert np.array_equal(np.asarray(job.outputs), out)
        assert np.array_equal(np.asarray(stored.outputs), out)
    else:
        assert job.outputs is None and stored.outputs is None


@pytest.mark.parametrize("width", [4, 24 * 384])  # 32 B of outputs, 72 KiB
async def test_a_job_answered_from_the_cache_queues_its_webhook_with_the_record_less_inputs(
    queue: JobQueue, width: int
) -> None:
    """CACHED, for a job that asked for a webhook: the delivery entry carries the record as
    stored, less its inputs (kept here, INFERQ_KEEP_INPUTS), field for field."""
    kept = JobQueue(queue.redis, result_ttl_s=60, keep_inputs=True)
    job = Job(id="h1", model="echo", inputs=["a", "b"], tenant="t")
    job.webhook, job.status, job.cached = {"url": "http://127.0.0.1:9/hook"}, Status.SUCCEEDED, True
    out = np.arange(2 * width, dtype=np.float32).reshape(2, width)
    fields = encode_submit(job) | encode_final(Status.SUCCEEDED, finished_ms=7, outputs=out)
    assert (await kept.record_cached(job, fields)).outcome == "created"
    stored = await queue.redis.hgetall(keys.job("h1"))
    assert JobField.INPUTS.encode() in stored  # kept in the record...
    ((_, entry),) = await queue.redis.xrange(keys.webhooks("echo"))
    flat = msgpack.unpackb(entry[DeliveryField.RECORD.encode()], raw=True)
    delivered = dict(zip(flat[::2], flat[1::2], strict=True))
    assert delivered == {k: v for k, v in stored.items() if k != JobField.INPUTS.encode()}
    published = decode_published(entry[DeliveryField.RECORD.encode()])  # ...not in the delivery
    assert published is not None and published.inputs == [] and published.cached
    assert np.array_equal(np.asarray(published.outputs), out)


async def test_finish_a_batch_in_one_call(queue: JobQueue) -> None:
    """One script call for many jobs: each job keeps its own outcome, ack and dead letter."""
    await queue.ensure_group("echo")
    for i in range(4):
        await queue.submit(Job(id=f"b{i}", model="echo", inputs=["a"] * (i + 1), priority="normal"))
    await queue.submit(Job(id="hi", model="echo", inputs=["a"], priority="high"))
    entries = {e.job_id: e for e in await queue.read("echo", "c1", count=10, block_ms=100)}
    assert len(entries) == 5 and await queue.queued_items("echo") == 11
    ok = encode_final(Status.SUCCEEDED, finished_ms=1, outputs=np.ones((1, 4), np.float32))
    failed = encode_final(Status.FAILED, finished_ms=1, error=JobError("poisoned", "x"))
    assert await queue.finish(
        [Final("echo", entries["b1"].stream, entries["b1"].entry_id, "b1", ok)]
    ) == [1]
    await queue.redis.delete(keys.job("b2"))  # its record expired
    finals = [
        Final("echo", entries[j].stream, entries[j].entry_id, j, fields, dead_letter=dead)
        for j, fields, dead in (
            ("b0", ok, False), ("b1", failed, False), ("b2", ok, False),
            ("b3", failed, True), ("hi", ok, False),
        )
    ]  # fmt: skip
    assert await queue.finish(finals) == [1, 0, -1, 1, 1]
    got = {j: await queue.get(j) for j in ("b0", "b1", "b3", "hi")}
    assert {j: g.status for j, g in got.items() if g} == {
        "b0": Status.SUCCEEDED, "b1": Status.SUCCEEDED, "b3": Status.FAILED, "hi": Status.SUCCEEDED,
    }  # fmt: skip
    dead = await queue.redis.xrange(keys.dead("echo"))
    assert [fields[b"job"] for _, fields in dead] == [b"b3"]
    assert await queue.queued_items("echo") == 3  # b2's 3 items had no record left to release
    assert await queue.queue_depth("echo") == 0  # every entry, both lanes, acked and deleted
    assert await queue.read("echo", "c1", count=10, block_ms=None, pending=True) == []


async def test_admission_cap_is_atomic_and_counts_items(queue: JobQueue) -> None:
    a = await queue.submit(Job(id="a", model="echo", inputs=["x"] * 3), max_queue=4)
    b = await queue.submit(Job(id="b", model="echo", inputs=["x"] * 2), max_queue=4)
    assert (a.outcome, b.outcome, b.depth) == ("created", "full", 3)
    assert await queue.get("b") is None and await queue.queue_depth("echo") == 1


async def test_idempotency_key_returns_the_first_job(queue: JobQueue) -> None:
    first = await queue.submit(
        Job(id="k1", model="echo", inputs=["x"]), idempotency=Idempotency("h")
    )
    second = await queue.submit(
        Job(id="k2", model="echo", inputs=["x"]), idempotency=Idempotency("h")
    )
    other = await queue.submit(
        Job(id="k3", model="echo", inputs=["x"], tenant="t2"), idempotency=Idempotency("h")
    )
    assert first.outcome == "created" and (second.outcome, second.job_id) == ("duplicate", "k1")
    assert other.outcome == "created"  # keys are per tenant
    assert await queue.get("k2") is None


async def test_cancel_only_if_queued_and_hand_back(queue: JobQueue) -> None:
    await queue.ensure_group("echo")
    job = Job(id="c1", model="echo", inputs=["x"], priority="high")
    await queue.submit(job)
    (entry,) = await queue.read("echo", "w", count=5, block_ms=None)
    assert entry.stream == keys.stream("echo", "high")
    (running,) = await queue.claim(["c1"], 5)
    assert running is not None
    cancelled = encode_final(Status.CANCELLED, finished_ms=6, error=JobError("cancelled", "x"))
    assert (
        await queue.cancel(running.job, cancelled, only_if_queued=True) == 2
    )  # started: not cancelled
    await queue.hand_back([entry])  # a stopping worker gives it back, uncounted
    back = await queue.get("c1")
    assert back is not None and back.status is Status.QUEUED and back.attempts == 0
    assert back.entry != entry.entry_id and await queue.queue_depth("echo") == 1
    assert await queue.cancel(back, cancelled, only_if_queued=True) == 1
    assert (await queue.get("c1")).status is Status.CANCELLED  # type: ignore[union-attr]
    assert await queue.cancel(back, cancelled, only_if_queued=False) == 0
    assert await queue.queued_items("echo") == 0


async def test_byte_cap_counts_input_bytes_and_finishing_releases_them(queue: JobQueue) -> None:
    await queue.ensure_group("echo")
    image = {"image": b"\x89PNG\r\n\x1a\n" + b"x" * 992}  # 1,000 bytes, raw bin in Redis
    first = await queue.submit(Job(id="i1", model="echo", inputs=[image]), max_bytes=1500)
    assert first.outcome == "created" and await queue.queued_bytes("echo") == 1000
    second = await queue.submit(Job(id="i2", model="echo", inputs=[image]), max_bytes=1500)
    assert (second.outcome, second.depth) == ("full_bytes", 1000)
    stored = await queue.get("i1")
    assert stored is not None and stored.inputs == [image]  # bytes round-trip, not base64
    (entry,) = await queue.read("echo", "c1", count=1, block_ms=100)
    done = encode_final(Status.SUCCEEDED, finished_ms=1, outputs=[{"label": "x"}])
    assert await queue.finish([Final("echo", entry.stream, entry.entry_id, "i1", done)]) == [1]
    assert await queue.queued_bytes("echo") == 0
    got = await queue.get("i1")
    assert got is not None and got.outputs == [{"label": "x"}]  # structured outputs round-trip
    alone = await queue.submit(Job(id="big", model="echo", inputs=[image] * 3), max_bytes=1500)
    assert alone.outcome == "created"  # an empty queue admits even a job over the cap


async def test_submits_of_one_turn_go_out_as_one_pipeline_each_with_its_own_outcome(
    queue: JobQueue,
) -> None:
    """Calls made side by side share one connection (not one each), and a refusal, a
    duplicate and a creation in one pipeline each reach their own caller."""
    jobs = [Job(id=f"b{i}", model="echo", inputs=["a"]) for i in range(12)]
    jobs.append(Job(id="b0", model="echo", inputs=["a"]))  # a retry beside its first try
    done = await asyncio.gather(*(queue.submit(j, max_queue=5) for j in jobs))
    outcomes = [d.outcome for d in done]
    assert outcomes.count("created") == 5 and outcomes.count("full") == 7
    assert outcomes[-1] == "duplicate" and done[-1].job_id == "b0"
    assert all(d.depth == 5 for d in done if d.outcome == "full")
    assert await queue.queue_depth("echo") == 5
    created = {d.job_id for d in done if d.outcome == "created"}
    assert created == {f"b{i}" for i in range(5)}  # in the order they were made
    assert [await queue.get(f"b{i}") for i in range(5, 12)] == [None] * 7
    # 13 calls (and these reads): one connection; multiplexed, the calls' and the reads'.
    assert len(await queue.redis.client_list()) == (2 if getattr(queue.redis, "mux", None) else 1)


async def test_a_batch_after_the_scripts_were_flushed_loads_them_and_answers_each(
    queue: JobQueue,
) -> None:
    await queue.redis.script_flush()  # as a restarted Redis would have it
    jobs = [Job(id=f"f{i}", model="echo", inputs=["a"]) for i in range(6)]
    done = await asyncio.gather(*(queue.submit(j) for j in jobs))
    assert [d.outcome for d in done] == ["created"] * 6
    assert await queue.queue_depth("echo") == 6


async def test_a_cancelled_caller_leaves_the_others_of_its_batch_answered(
    queue: JobQueue,
) -> None:
    """The first call of a turn sends the batch; cancelled while the others join, its own
    job may or may not be written (a cancelled request's client never heard back and
    retries by key), the others' still are."""
    tasks = [
        asyncio.create_task(queue.submit(Job(id=f"c{i}", model="echo", inputs=["a"])))
        for i in range(5)
    ]
    await asyncio.sleep(0)  # each task reaches its submit; the first waits for the rest
    tasks[0].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert [r.outcome for r in results[1:] if isinstance(r, Submitted)] == ["created"] * 4
    assert await queue.queue_depth("echo") in (4, 5)


async def test_a_batch_on_a_dead_connection_fails_every_call_as_unavailable() -> None:
    dead = Redis.from_url(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=1)
    q = JobQueue(dead, result_ttl_s=60)
    jobs = [Job(id=f"d{i}", model="echo", inputs=["a"]) for i in range(4)]
    results = await asyncio.gather(*(q.submit(j) for j in jobs), return_exceptions=True)
    assert all(isinstance(r, QueueUnavailable) for r in results), results
    await dead.aclose()


async def test_a_read_times_out_empty_keeps_a_deleted_pending_entry_and_recreates_its_group(
    queue: JobQueue,
) -> None:
    """XREADGROUP's edges, on either connection a worker may read on: nothing after its
    BLOCK; an entry deleted while pending reads back with no job (the caller acks it); a
    stream that vanished (flushed, evicted) answers NOGROUP, which recreates the group."""
    await queue.ensure_group("echo")
    assert await queue.read("echo", "c1", count=10, block_ms=50) == []
    await queue.submit(Job(id="r1", model="echo", inputs=["a"]))
    (entry,) = await queue.read("echo", "c1", count=10, block_ms=100)
    assert entry.job_id == "r1" and entry.stream == keys.stream("echo")
    await queue.redis.xdel(entry.stream, entry.entry_id)
    (gone,) = await queue.read("echo", "c1", count=10, block_ms=None, pending=True)
    assert (gone.stream, gone.entry_id, gone.job_id) == (entry.stream, entry.entry_id, "")
    await queue.redis.delete(*queue.streams("echo"))
    assert await queue.read("echo", "c1", count=10, block_ms=50) == []  # NOGROUP: recreated
    groups = await queue.redis.xinfo_groups(keys.stream("echo"))
    assert [g["name"] for g in groups] == [keys.GROUP.encode()]
    await queue.submit(Job(id="r2", model="echo", inputs=["b"]))
    assert [e.job_id for e in await queue.read("echo", "c1", count=10, block_ms=100)] == ["r2"]
