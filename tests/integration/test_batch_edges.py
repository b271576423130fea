"""The Batch API at its edges, against a real API, worker and Redis: a junk file never stalls
or bloats the API, a line too big to parse fails alone, tenants' quotas answer 429 and show
in /v1/usage, and tenants take turns for a process's batch slots."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import orjson

from tests.integration.stack import Stack, wait_for
from tests.integration.test_edges import GROWTH_BOUND_BYTES, STALL_BOUND_S, measure

A = {"Authorization": "Bearer key-a-0123456789"}
B = {"Authorization": "Bearer key-b-0123456789"}


def _upload_raw(base: str, data: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    files = {"file": ("requests.jsonl", data, "application/jsonl")}
    return httpx.post(
        f"{base}/v1/files", files=files, data={"purpose": "batch"}, headers=headers, timeout=60
    )


def _create(base: str, file_id: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"input_file_id": file_id, "endpoint": "/v1/infer", "completion_window": "24h"}
    return httpx.post(f"{base}/v1/batches", json=body, headers=headers, timeout=60)


def _line(cid: str, body: dict[str, Any]) -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/infer", "body": body})


def test_a_16_mb_junk_file_neither_stalls_nor_bloats_the_api(stack: Stack) -> None:
    base = stack.api()
    junk = b"a\n" * 8_000_000  # 16 MB, 8 M "requests"
    r, probe, grown = measure(stack, base, lambda: _upload_raw(base, junk))
    assert r.status_code == 200, r.text
    assert probe.worst_s < STALL_BOUND_S, f"upload: /healthz stalled {probe.worst_s:.2f}s"
    file_id = r.json()["id"]
    r, probe, grown_create = measure(stack, base, lambda: _create(base, file_id))
    assert r.status_code == 422 and "INFERQ_MAX_BATCH_LINES=50000" in r.text
    assert probe.worst_s < STALL_BOUND_S, f"create: /healthz stalled {probe.worst_s:.2f}s"
    assert max(grown, grown_create) < GROWTH_BOUND_BYTES, (grown, grown_create)


def _ended(base: str, batch_id: str) -> httpx.Response:
    def final() -> httpx.Response | None:
        r = httpx.get(f"{base}/v1/batches/{batch_id}", timeout=10)
        return r if r.json()["status"] in ("completed", "failed", "expired", "cancelled") else None

    return wait_for(final, 120, f"batch {batch_id} to end", interval_s=0.05)


def test_a_16_mb_tensor_on_one_line_neither_stalls_nor_bloats_the_api(stack: Stack) -> None:
    """4 M values on one line, 4 times INFERQ_MAX_JSON_VALUES: neither the check at create
    nor the run parses it (each would build every value, the run on the event loop); the
    line fails alone as too_large."""
    stack.worker()
    base = stack.api()
    rows, cols = 2000, 2000
    tensor = {"dtype": "float32", "shape": [rows, cols], "data": [[0.5] * cols] * rows}
    huge = _line("huge", {"input": {"tensor": tensor}}) + b"\n"
    assert len(huge) > 16_000_000
    r, probe, grown_upload = measure(stack, base, lambda: _upload_raw(base, huge))
    assert r.status_code == 200, r.text
    assert probe.worst_s < STALL_BOUND_S, f"upload: /healthz stalled {probe.worst_s:.2f}s"
    file_id = r.json()["id"]

    def create_and_run() -> httpx.Response:
        created = _create(base, file_id)
        assert created.status_code == 200, created.text
        return _ended(base, created.json()["id"])

    r, probe, grown_run = measure(stack, base, create_and_run)
    batch = r.json()
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    errors = httpx.get(f"{base}/v1/files/{batch['error_file_id']}/content", timeout=10)
    (error,) = [orjson.loads(x)["error"] for x in errors.content.splitlines()]
    assert error["code"] == "too_large" and "INFERQ_MAX_JSON_VALUES" in error["message"]
    assert probe.answered > 0 and not probe.errors, probe.errors
    assert probe.worst_s < STALL_BOUND_S, f"create and run: /healthz stalled {probe.worst_s:.2f}s"
    assert max(grown_upload, grown_run) < GROWTH_BOUND_BYTES, (grown_upload, grown_run)


def test_a_line_too_big_to_parse_fails_alone(stack: Stack) -> None:
    stack.worker()
    base = stack.api(max_json_values=10_000)
    huge = _line("huge", {"input": {"tensor": {"dtype": "float32", "shape": [200, 100],
                                                "data": [[0.5] * 100] * 200}}})  # fmt: skip
    data = b"\n".join([_line("ok", {"input": "fine"}), huge]) + b"\n"
    file_id = _upload_raw(base, data).json()["id"]
    batch = _create(base, file_id).json()
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=20)

    def ended() -> Any:
        b = client.batches.retrieve(batch["id"])
        return b if b.status in ("completed", "failed") else None

    done = wait_for(ended, 30, "the batch to end", interval_s=0.1)
    assert done.status == "completed" and done.request_counts.completed == 1
    errors = [
        orjson.loads(x) for x in client.files.content(done.error_file_id).content.splitlines()
    ]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [(None, "too_large")]


def test_tenant_quotas_answer_429_and_show_in_usage(stack: Stack) -> None:
    base = stack.api(
        api_keys="a:key-a-0123456789,b:key-b-0123456789", tenant_max_files=2, tenant_max_batches=1
    )
    lines = b"\n".join(_line(f"c{i}", {"input": "x"}) for i in range(3)) + b"\n"
    first = _upload_raw(base, lines, A).json()["id"]
    assert _upload_raw(base, lines, A).status_code == 200
    refused = _upload_raw(base, lines, A)
    assert refused.status_code == 429 and "INFERQ_TENANT_MAX_FILES=2" in refused.text
    assert refused.headers["retry-after"]
    assert _upload_raw(base, lines, B).status_code == 200  # b's quota is its own
    assert _create(base, first, A).status_code == 200  # no worker: it stays running
    again = _create(base, first, A)
    assert again.status_code == 429 and "INFERQ_TENANT_MAX_BATCHES=1" in again.text
    usage = httpx.get(f"{base}/v1/usage", headers=A, timeout=5).json()
    assert usage["tenant"] == "a"
    assert usage["files"]["count"] == 2 and usage["files"]["bytes"] == 2 * len(lines)
    assert usage["batches"] == {"running": 1, "max_running": 1}
    other = httpx.get(f"{base}/v1/usage", headers=B, timeout=5).json()
    assert other["files"]["count"] == 1 and other["batches"]["running"] == 0


def test_concurrent_creates_of_one_tenant_cannot_pass_its_batch_quota(stack: Stack) -> None:
    """12 concurrent POST /v1/batches of one tenant against INFERQ_TENANT_MAX_BATCHES=3 (no
    worker: every batch stays running): each counts against the quota from its check until
    its record is listed, so three are created and nine refused with 429."""
    base = stack.api(tenant_max_batches=3)
    lines = b"\n".join(_line(f"c{i}", {"input": "x"}) for i in range(2000)) + b"\n"
    file_id = _upload_raw(base, lines).json()["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/infer", "completion_window": "24h"}

    async def creates() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(
                *(c.post(f"{base}/v1/batches", json=body) for _ in range(12))
            )

    replies = asyncio.run(creates())
    codes = sorted(r.status_code for r in replies)
    assert codes == [200] * 3 + [429] * 9, [(r.status_code, r.text[:120]) for r in replies]
    usage = httpx.get(f"{base}/v1/usage", timeout=5).json()
    assert usage["batches"] == {"running": 3, "max_running": 3}


def test_a_tenant_with_one_batch_is_not_queued_behind_anothers_many(stack: Stack) -> None:
    """A process runs 4 batches at once. Tenant a queues 12 slow ones, then b one: b's takes
    the first slot that frees, not a place after a's twelve."""
    stack.worker(echo_batch_delay_ms=400)
    base = stack.api(
        api_keys="a:key-a-0123456789,b:key-b-0123456789", batch_in_flight=1, tenant_max_batches=20
    )
    lines = b"\n".join(_line(f"c{i}", {"input": f"x{i}"}) for i in range(4)) + b"\n"
    files_a = [_upload_raw(base, lines, A).json()["id"] for _ in range(12)]
    file_b = _upload_raw(base, lines, B).json()["id"]
    mine = [_create(base, f, A).json()["id"] for f in files_a]  # each runs ~1.6 s
    theirs = _create(base, file_b, B).json()["id"]

    def started(batch_id: str, headers: dict[str, str]) -> int | None:
        r = httpx.get(f"{base}/v1/batches/{batch_id}", headers=headers, timeout=5)
        return r.json()["in_progress_at"]  # type: ignore[no-any-return]

    b_at = wait_for(lambda: started(theirs, B), 90, "b's batch to start", interval_s=0.05)
    a_at = [t for t in (started(x, A) for x in mine) if t is not None]
    # Only a's first wave (4 slots) started before b's one batch; at most the wave after
    # it ties with it (timestamps are whole seconds).
    assert sum(1 for t in a_at if t < b_at) <= 4, (b_at, sorted(a_at))
    assert len(a_at) < 12  # b's started while a still had batches waiting


def test_a_nearly_full_redis_refuses_uploads_and_batches_with_503(stack: Stack) -> None:
    base = stack.api(redis_memory_high_water=0.5)
    lines = b"\n".join(_line(f"c{i}", {"input": "x"}) for i in range(3)) + b"\n"
    file_id = _upload_raw(base, lines).json()["id"]
    used = int(stack.r.info("memory")["used_memory"])
    stack.r.config_set("maxmemory", str(used * 3 // 2))  # two thirds full: past the mark
    stack.r.config_set("maxmemory-policy", "noeviction")
    try:

        def refused() -> httpx.Response | None:  # the API reads INFO memory at most every 1 s
            r = _upload_raw(base, lines)
            return r if r.status_code == 503 else None

        r = wait_for(refused, 10, "uploads refused", interval_s=0.1)
        assert r.headers["retry-after"]
        assert "INFERQ_REDIS_MEMORY_HIGH_WATER" in r.json()["error"]["message"]
        r = _create(base, file_id)
        assert r.status_code == 503 and r.headers["retry-after"], r.text
    finally:
        stack.r.config_set("maxmemory", "0")
    wait_for(lambda: _create(base, file_id).status_code == 200, 10, "batches accepted again")
