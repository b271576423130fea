"""The whole path over real processes: HTTP API → Redis Streams → worker → back."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import httpx
import numpy as np

from inferq.worker.models.echo import expected_vector
from tests.integration.stack import ROOT, Stack, wait_for


def _submit(base: str, inputs: list[str], **extra: object) -> dict:
    r = httpx.post(f"{base}/v1/jobs", json={"inputs": inputs, **extra}, timeout=10)
    assert r.status_code == 202, r.text
    assert r.headers["location"] == f"/v1/jobs/{r.json()['id']}"
    return r.json()


def test_async_submit_then_get(stack: Stack) -> None:
    stack.worker()
    base = stack.api()
    texts = ["hello world", "a b c", "single"]
    accepted = _submit(base, texts)
    assert accepted["status"] == "queued" and accepted["model"] == "echo"
    assert len(accepted["id"]) >= 22  # 128 random bits, URL-safe

    def final() -> dict | None:
        body = httpx.get(f"{base}/v1/jobs/{accepted['id']}", timeout=5).json()
        return body if body["status"] == "succeeded" else None

    body = wait_for(final, 10, "the job to succeed", interval_s=0.05)
    assert body["outputs"] == [expected_vector(t) for t in texts]
    t = body["timings"]
    assert t["total_ms"] >= t["queued_ms"] >= 0 and t["run_ms"] >= 0
    assert 1 <= t["batch_size"] <= 3 and t["batch_tokens"] >= 1
    assert httpx.get(f"{base}/v1/jobs/doesnotexist", timeout=5).status_code == 404


def test_long_poll_is_woken_by_the_completion_message(stack: Stack) -> None:
    """The mechanism, not a latency: with the periodic re-read an hour away, only the
    worker's completion message can end this wait early. (Latency: `inferq bench`.)"""
    stack.worker(echo_batch_delay_ms=700)
    base = stack.api(long_poll_recheck_s=3600)
    job = _submit(base, ["slow one"])
    t0 = time.monotonic()
    r = httpx.get(f"{base}/v1/jobs/{job['id']}", params={"wait": 30}, timeout=40)
    answered = time.monotonic()
    body = r.json()
    assert body["status"] == "succeeded" and body["timings"]["run_ms"] >= 700
    assert answered - t0 < 20, f"answered after {answered - t0:.1f}s: not woken"
    assert stack_finished_ms(stack, job["id"]) <= time.time() * 1000


def stack_finished_ms(stack: Stack, job_id: str) -> int:
    from inferq.shared import keys
    from inferq.shared.jobs import decode_job

    job = decode_job(stack.r.hgetall(keys.job(job_id)))
    assert job.finished_ms is not None
    return job.finished_ms


def test_long_poll_times_out_with_current_state(stack: Stack) -> None:
    base = stack.api()  # no worker: the job stays queued
    job = _submit(base, ["nobody serves me"])
    t0 = time.monotonic()
    r = httpx.get(f"{base}/v1/jobs/{job['id']}", params={"wait": 0.5}, timeout=10)
    assert 0.45 <= time.monotonic() - t0 < 3
    assert r.status_code == 200 and r.json()["status"] == "queued"


def test_sync_infer_and_202_fallback(stack: Stack) -> None:
    stack.worker(echo_batch_delay_ms=400)
    base = stack.api()
    r = httpx.post(f"{base}/v1/infer", json={"input": "quick"}, timeout=15)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "succeeded"
    assert r.json()["outputs"] == [expected_vector("quick")]

    r = httpx.post(f"{base}/v1/infer", json={"input": "too slow", "wait": 0.05}, timeout=15)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert r.headers["location"] == f"/v1/jobs/{job_id}"
    # Nothing is lost: the client keeps waiting with GET.
    r = httpx.get(f"{base}{r.headers['location']}", params={"wait": 10}, timeout=15)
    assert r.json()["status"] == "succeeded"


def test_two_api_processes_share_one_redis(stack: Stack) -> None:
    stack.worker(echo_batch_delay_ms=300)
    a, b = stack.api(), stack.api()
    job = _submit(a, ["submitted on a"])
    r = httpx.get(f"{b}/v1/jobs/{job['id']}", params={"wait": 10}, timeout=15)
    assert r.json()["status"] == "succeeded"
    assert r.json()["outputs"] == [expected_vector("submitted on a")]


async def test_microbatching_under_32_concurrent_clients(stack: Stack) -> None:
    max_tokens = 64
    stack.worker(echo_token_delay_ms=0.5, max_batch_tokens=max_tokens, max_batch_size=16)
    base = stack.api()
    texts = [" ".join(["w"] * (1 + i % 7)) for i in range(32 * 4)]

    async def client(c: httpx.AsyncClient, i: int) -> list[dict]:
        out = []
        for text in texts[i::32]:
            r = await c.post(f"{base}/v1/infer", json={"input": text})
            assert r.status_code == 200, r.text
            out.append(r.json())
        return out

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as c:
        results = [j for js in await asyncio.gather(*(client(c, i) for i in range(32))) for j in js]
    assert len(results) == len(texts)
    assert all(j["status"] == "succeeded" for j in results)
    sizes = [j["timings"]["batch_size"] for j in results]
    tokens = [j["timings"]["batch_tokens"] for j in results]
    assert max(sizes) > 1, "no microbatching happened"
    assert max(tokens) <= max_tokens


def test_model_error_fails_only_its_job(stack: Stack) -> None:
    stack.worker(model="flaky=tests.fixtures.models:FlakyEcho", models="flaky", max_wait_ms=200)
    base = stack.api(model="flaky")
    good = [_submit(base, [f"fine {i}", "also fine"]) for i in range(5)]
    bad = _submit(base, ["ok", "this goes boom"])
    good += [_submit(base, [f"later {i}"]) for i in range(3)]
    r = httpx.get(f"{base}/v1/jobs/{bad['id']}", params={"wait": 10}, timeout=15).json()
    assert r["status"] == "failed"
    assert r["error"]["code"] == "model_error" and "boom" in r["error"]["message"]
    assert "outputs" not in r
    for g in good:
        body = httpx.get(f"{base}/v1/jobs/{g['id']}", params={"wait": 10}, timeout=15).json()
        assert body["status"] == "succeeded", body


def test_readyz_reflects_worker_presence(stack: Stack) -> None:
    base = stack.api()
    r = httpx.get(f"{base}/readyz", timeout=5)
    assert r.status_code == 503 and r.json()["unserved_models"] == ["echo"]
    w = stack.worker()
    assert httpx.get(f"{base}/readyz", timeout=5).status_code == 200
    w.stop()  # graceful stop unregisters at once

    wait_for(
        lambda: httpx.get(f"{base}/readyz", timeout=5).status_code == 503, 10, "readyz to drop"
    )


def test_worker_restart_rereads_its_pending_entries(stack: Stack) -> None:
    """A SIGKILLed worker's held jobs are finished by its restart (same consumer name)."""
    w = stack.worker(echo_batch_delay_ms=2000, worker_id="w-restart")
    base = stack.api()
    job = _submit(base, ["held when killed"])
    wait_for(
        lambda: httpx.get(f"{base}/v1/jobs/{job['id']}", timeout=5).json()["status"] == "running",
        10,
        "the worker to take the job",
    )
    w.popen.kill()
    w.wait(10)
    stack.worker(worker_id="w-restart")
    body = httpx.get(f"{base}/v1/jobs/{job['id']}", params={"wait": 15}, timeout=20).json()
    assert body["status"] == "succeeded"
    assert body["outputs"] == [expected_vector("held when killed")]


def test_bad_requests_are_4xx(stack: Stack) -> None:
    base = stack.api(max_inputs_per_job=3, max_input_chars=10)
    cases = [
        (b"{bad json", 422),
        (b'{"inputs": []}', 422),
        (b'{"inputs": [1, 2]}', 422),
        (b'{"input": "a", "inputs": ["b"]}', 422),
        (b'{"inputs": ["a", "b", "c", "d"]}', 413),
        (b'{"input": "much too long for ten"}', 413),
        (b'{"input": "   "}', 422),
        (b'{"input": "a", "model": "nope"}', 404),
        (b'{"input": "\xff\xfe"}', 422),  # not UTF-8: invalid JSON
        (b"[]", 422),
    ]
    for body, status in cases:
        r = httpx.post(
            f"{base}/v1/jobs", content=body, headers={"content-type": "application/json"}, timeout=5
        )
        assert r.status_code == status, (body, r.status_code, r.text)
        assert "error" in r.json()
    r = httpx.post(f"{base}/v1/jobs", json={"inputs": ["a", "b", "c", "d"]}, timeout=5)
    assert "INFERQ_MAX_INPUTS_PER_JOB" in r.json()["error"]["message"]


def test_api_never_imports_torch(redis_url: str) -> None:
    code = (
        "import sys\n"
        "from fastapi.testclient import TestClient\n"
        "from inferq.api.app import create_app\n"
        "from inferq.shared.settings import Settings\n"
        f"s = Settings(redis_url={redis_url!r})\n"
        "with TestClient(create_app(s)) as c:\n"
        "    assert c.get('/healthz').status_code == 200\n"
        "    assert c.post('/v1/jobs', json={'input': 'x'}).status_code == 202\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'onnxruntime', 'transformers')]\n"
        "assert not bad, bad\n"
        "print('clean')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr


def test_minilm_through_the_whole_stack(stack: Stack) -> None:
    from inferq.worker.models.minilm import MiniLM

    stack.worker(model="minilm", models="minilm")
    base = stack.api(model="minilm")
    texts = ["A man is playing a guitar.", "Someone plays the guitar.", "Stocks fell today."]
    r = httpx.post(f"{base}/v1/infer", json={"inputs": texts}, timeout=60)
    assert r.status_code == 200, r.text
    got = np.array(r.json()["outputs"], dtype=np.float32)
    model = MiniLM()
    model.load("cpu")
    want = model.run([p.payload for p in model.prepare_texts(texts)])
    assert got.shape == (3, 384)
    np.testing.assert_allclose(got, want, atol=1e-5)
