"""Edges, round two (issue 28), against a real redis-server with a small maxmemory and real
API and worker processes: concurrent submits and uploads cannot run Redis past its
maxmemory or leave bytes behind, a Redis refusal answers as the memory guard's 503, batch
slots are shared between tenants, and readiness says when submits are refused."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import redis

from inferq.shared import keys
from tests.integration.stack import Stack, wait_for

MiB = 2**20
KEY_A, KEY_B = "key-a-0123456789abcdef", "key-b-0123456789abcdef"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
GUARD = "INFERQ_REDIS_MEMORY_HIGH_WATER"


@contextmanager
def small_redis(r: redis.Redis, maxmemory: int) -> Iterator[None]:
    """maxmemory (noeviction) for the block; the peak and error stats start afresh."""
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", str(maxmemory))
    r.config_resetstat()
    try:
        yield
    finally:
        r.config_set("maxmemory", "0")


def _kinds(replies: list[httpx.Response]) -> dict[str, int]:
    """How many replies were accepted, refused by the guard (503 naming it), refused by a
    quota (429), or "unreachable" (a 503 from a Redis error), or anything else."""
    out: dict[str, int] = {}
    for r in replies:
        if r.status_code in (200, 202):
            kind = "accepted"
        elif r.status_code == 503 and ("maxmemory" in r.text or GUARD in r.text):
            kind = "guard"
        elif r.status_code == 429:
            kind = "quota"
        elif r.status_code == 503:
            kind = "unreachable"
        else:
            kind = f"other {r.status_code}: {r.text[:200]}"
        out[kind] = out.get(kind, 0) + 1
    return out


async def _burst(method: str, url: str, n: int, **kwargs: Any) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120) as c:
        return await asyncio.gather(*(c.request(method, url, **kwargs) for _ in range(n)))


def test_concurrent_big_submits_stay_under_maxmemory_and_answer_the_guards_503(
    stack: Stack,
) -> None:
    """30 concurrent 4.9 MB submits against 128 MiB: the guard reserves each one's bytes as
    it admits it, so Redis's peak stays under maxmemory and every refusal is its 503."""
    base = stack.api(max_queue_bytes=2**40, max_queue=10**6)
    body = orjson.dumps({"inputs": ["w" * 20_000] * 245})  # 4.9 MB of inputs
    with small_redis(stack.r, 128 * MiB):
        replies = asyncio.run(
            _burst(
                "POST",
                f"{base}/v1/jobs",
                30,
                content=body,
                headers={"content-type": "application/json"},
            )
        )
        info = stack.r.info("memory")
        errors = stack.r.info("errorstats")
    print(
        "after:",
        info["used_memory"] / MiB,
        "peak",
        info["used_memory_peak"] / MiB,
        "lua",
        info.get("used_memory_lua"),
    )
    kinds = _kinds(replies)
    peak = int(info["used_memory_peak"]) / (128 * MiB)
    print(f"30 x 4.9 MB submits: peak {peak:.0%} of maxmemory, answers {kinds}")
    assert kinds.get("accepted", 0) > 0 and set(kinds) <= {"accepted", "guard"}, kinds
    assert all(r.headers.get("retry-after") for r in replies if r.status_code == 503)
    assert peak <= 1.0, peak
    assert not any(k.startswith("errorstat_OOM") for k in errors), errors


def _upload(base: str, data: bytes, headers: dict[str, str] | None = None) -> httpx.Request:
    files = {"file": ("big.jsonl", data, "application/jsonl")}
    return httpx.Request(
        "POST", f"{base}/v1/files", files=files, data={"purpose": "batch"}, headers=headers
    )


async def _uploads(base: str, data: bytes, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=180) as c:
        return await asyncio.gather(*(c.send(_upload(base, data)) for _ in range(n)))


def _leftovers(r: redis.Redis) -> list[str]:
    """File bytes with no record: an upload key, or a content key whose file is not there."""
    out = []
    for key in r.scan_iter(match=f"{keys.PREFIX}:file:*", count=1000):
        name = key.decode()
        orphan = name.endswith(":content") and not r.exists(name.removesuffix(":content"))
        if ":upload:" in name or orphan:
            out.append(name)
    return out


def test_concurrent_oversized_uploads_leave_nothing_behind_and_lock_nobody_out(
    stack: Stack,
) -> None:
    """5 concurrent 60 MiB uploads against 200 MiB: those that do not fit are refused by
    the guard before a byte is written (not "unreachable" part way), no file bytes are left
    without a record, and a submit afterwards is accepted."""
    base = stack.api(max_batch_file_bytes=64 * MiB, max_body_bytes=64 * MiB)
    data = (
        b'{"custom_id":"x","method":"POST","url":"/v1/infer","body":{"input":"a"}}\n' * 900_000
    )[: 60 * MiB]
    with small_redis(stack.r, 200 * MiB):
        replies = asyncio.run(_uploads(base, data, 5))
        kinds = _kinds(replies)
        with contextlib.suppress(AssertionError):  # reported below
            wait_for(lambda: not _leftovers(stack.r), 10, "no file bytes left", 0.1)
        left = _leftovers(stack.r)
        left_mib = sum(int(stack.r.strlen(k)) for k in left) / MiB
        used = int(stack.r.info("memory")["used_memory"]) / (200 * MiB)
        submit = httpx.post(f"{base}/v1/jobs", json={"input": "hi"}, timeout=10)
        print(
            f"5 x 60 MiB uploads: answers {kinds}; {len(left)} keys ({left_mib:.0f} MiB) "
            f"left with no record, used {used:.0%} of maxmemory; a submit after: "
            f"{submit.status_code}"
        )
        assert not left and set(kinds) <= {"accepted", "guard", "quota"}, (kinds, left)
        assert kinds.get("accepted", 0) >= 1, kinds
        usage = httpx.get(f"{base}/v1/usage", timeout=10).json()["files"]
        assert usage == {
            **usage,
            "count": kinds["accepted"],
            "bytes": kinds["accepted"] * len(data),
        }
        # Nobody is locked out: a normal submit is accepted (the guard reads afresh).
        assert submit.status_code == 202, submit.text


def _line(cid: str, text: str) -> bytes:
    return orjson.dumps(
        {"custom_id": cid, "method": "POST", "url": "/v1/infer", "body": {"input": text}}
    )


def _batch(base: str, lines: int, headers: dict[str, str], tag: str) -> str:
    data = b"\n".join(_line(f"{tag}{i}", f"{tag} {i}") for i in range(lines)) + b"\n"
    files = {"file": ("in.jsonl", data, "application/jsonl")}
    up = httpx.post(
        f"{base}/v1/files", files=files, data={"purpose": "batch"}, headers=headers, timeout=30
    )
    assert up.status_code == 200, up.text
    body = {"input_file_id": up.json()["id"], "endpoint": "/v1/infer", "completion_window": "24h"}
    r = httpx.post(f"{base}/v1/batches", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def _status(base: str, batch_id: str, headers: dict[str, str]) -> dict[str, Any]:
    return httpx.get(f"{base}/v1/batches/{batch_id}", headers=headers, timeout=10).json()  # type: ignore[no-any-return]


def test_a_tenants_small_batch_is_not_held_behind_anothers_long_ones(stack: Stack) -> None:
    """Tenant a's 4 long batches hold all 4 slots of the one API process; b's 3-line batch
    still completes within a bound: one of a's hands its slot back, and resumes later."""
    stack.worker(echo_batch_delay_ms=300)
    base = stack.api(api_keys=f"a:{KEY_A},b:{KEY_B}", batch_in_flight=1, tenant_max_batches=10)
    mine = [_batch(base, 300, A, f"a{k}-") for k in range(4)]  # ~90 s each, one line at a time
    wait_for(
        lambda: all(_status(base, b, A)["status"] == "in_progress" for b in mine),
        30,
        "a's 4 batches running",
        interval_s=0.1,
    )
    created = time.monotonic()
    theirs = _batch(base, 3, B, "b-")
    done = wait_for(
        lambda: (s := _status(base, theirs, B))["status"] == "completed" and s,
        45,
        "b's batch to complete",
        interval_s=0.1,
    )
    took = time.monotonic() - created
    a_left = [s for s in (_status(base, b, A) for b in mine) if s["status"] == "in_progress"]
    print(f"b's 3-line batch behind a's 4 long ones: completed in {took:.1f} s")
    assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert len(a_left) == 4  # a's are still running: b did not wait for one to end
    # The one handed back resumes and loses nothing: all of a's eventually make progress.
    wait_for(
        lambda: all(_status(base, b, A)["request_counts"]["completed"] > 0 for b in mine),
        30,
        "every one of a's batches to have progressed",
        interval_s=0.2,
    )


def test_readiness_says_not_ready_while_redis_refuses_writes(stack: Stack) -> None:
    """/readyz and /v2/health/ready: 503 with the reason while Redis refuses writes (here:
    too few replicas) and while the memory guard refuses every submit; ready again after."""
    base = stack.api(redis_memory_high_water=0.5)
    ready = [f"{base}/readyz", f"{base}/v2/health/ready"]
    stack.r.config_set("min-replicas-to-write", "1")  # no replica: every write is refused
    try:
        r = httpx.post(f"{base}/v1/jobs", json={"input": "x"}, timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"], r.text
        body = httpx.get(ready[0], timeout=10)
        assert body.status_code == 503 and "replicas" in body.json()["reason"], body.text
        assert httpx.get(ready[1], timeout=10).status_code == 503
    finally:
        stack.r.config_set("min-replicas-to-write", "0")
    # (No worker while writes are refused: a worker whose heartbeat cannot be written exits.)
    stack.worker()
    wait_for(
        lambda: [httpx.get(u, timeout=10).status_code for u in ready] == [200, 200],
        20,
        "ready again once Redis takes writes",
        interval_s=0.2,
    )
    # The memory guard: past the high-water mark, not ready; below it, ready again.
    # 4 MiB held, in small writes (a big one's query buffer lingers), and maxmemory 2 MiB
    # above what Redis held before: about two thirds full, past the 0.5 mark.
    used = int(stack.r.info("memory")["used_memory"])
    for i in range(16):
        stack.r.set(f"ballast:{i}", b"x" * (MiB // 4))
    with small_redis(stack.r, used + 6 * MiB):
        r = wait_for(
            lambda: (x := httpx.get(ready[0], timeout=10)).status_code == 503 and x,
            5,
            "not ready past the mark",
            interval_s=0.2,
        )
        assert GUARD in r.json()["reason"] and httpx.get(ready[1], timeout=10).status_code == 503
        stack.r.delete(*(f"ballast:{i}" for i in range(16)))  # drained
    wait_for(lambda: httpx.get(ready[0], timeout=10).status_code == 200, 5, "ready again", 0.2)


def test_concurrent_uploads_of_one_tenant_cannot_pass_its_file_bytes_quota(stack: Stack) -> None:
    """8 concurrent 4 MiB uploads against a 10 MiB quota: each is counted against the quota
    from its check until it is published, so at most two are kept."""
    base = stack.api(tenant_max_file_bytes=10 * MiB)
    replies = asyncio.run(_uploads(base, b"x" * (4 * MiB), 8))
    kinds = _kinds(replies)
    usage = httpx.get(f"{base}/v1/usage", timeout=10).json()["files"]
    print(f"8 x 4 MiB uploads, 10 MiB quota: answers {kinds}; {usage['bytes'] / MiB:.0f} MiB kept")
    assert set(kinds) <= {"accepted", "quota"} and usage["bytes"] <= 10 * MiB, (kinds, usage)
    assert kinds.get("accepted") == 2 and not _leftovers(stack.r), kinds
