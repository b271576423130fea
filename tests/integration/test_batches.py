"""The Batch API (/v1/files, /v1/batches) through the whole stack, driven by the official
`openai` client: outputs equal /v1/embeddings and /v1/infer, malformed lines, a runner
killed mid-batch, tenants, cancel, expiry and the refusals; and a batch on a Redis Cluster
(every script and MULTI of the batch API on one slot)."""

from __future__ import annotations

import base64
import io
import signal
import time
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest

from inferq.bench.corpus import load as load_corpus
from inferq.shared import keys
from inferq.worker.models.echo import expected_vector
from tests.integration.stack import Stack, wait_for

FINAL = ("completed", "failed", "expired", "cancelled")


def _client(base: str, key: str = "dummy") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=20)


def _line(cid: str, body: dict[str, Any], url: str = "/v1/embeddings") -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def _upload(client: openai.OpenAI, lines: list[bytes]) -> str:
    data = b"\n".join(lines) + b"\n"
    return client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch").id


def _finished(client: openai.OpenAI, batch_id: str, timeout_s: float = 30) -> Any:
    def final() -> Any:
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in FINAL else None

    return wait_for(final, timeout_s, f"batch {batch_id} to end", interval_s=0.1)


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [orjson.loads(x) for x in client.files.content(file_id).content.splitlines()]


def _by_id(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    ids = [x["custom_id"] for x in lines]
    assert len(ids) == len(set(ids)), "a custom_id is in the files twice"
    return {x["custom_id"]: x for x in lines}


def test_embeddings_batch_equals_the_endpoint(stack: Stack) -> None:
    stack.worker(model="minilm")
    base = stack.api(model="minilm")
    client = _client(base)
    texts = load_corpus("short")[:12]
    good = {f"t{i}": {"model": "minilm", "input": t} for i, t in enumerate(texts[:8])}
    good["pair"] = {"model": "minilm", "input": texts[8:10]}
    good["b64"] = {"model": "minilm", "input": texts[10], "encoding_format": "base64"}
    lines = [_line(cid, body) for cid, body in good.items()]
    lines.insert(2, b"{this is not json")
    lines.append(_line("empty", {"model": "minilm", "input": []}))  # the endpoint's 400
    lines.append(_line("other-url", {"input": "x"}, url="/v1/infer"))
    lines.append(_line("gpt", {"model": "text-embedding-3-small", "input": "x"}))  # 404
    batch = client.batches.create(
        input_file_id=_upload(client, lines),
        endpoint="/v1/embeddings",
        completion_window="24h",
        metadata={"run": "test"},
    )
    assert batch.status == "validating" and batch.metadata == {"run": "test"}
    batch = _finished(client, batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (len(lines), len(good))
    assert batch.request_counts.failed == 4
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at

    out = _by_id(_lines(client, batch.output_file_id))
    assert set(out) == set(good)
    for cid, body in good.items():
        line = out[cid]
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert line["id"].startswith("batch_req_") and line["response"]["request_id"]
        got = line["response"]["body"]
        want = httpx.post(f"{base}/v1/embeddings", json=body, timeout=20).json()
        assert got["model"] == want["model"] == "minilm" and got["usage"] == want["usage"]
        assert len(got["data"]) == len(want["data"])
        for g, w in zip(got["data"], want["data"], strict=True):
            if body.get("encoding_format") == "base64":
                g, w = (np.frombuffer(base64.b64decode(x["embedding"]), "<f4") for x in (g, w))
            else:
                g, w = np.array(g["embedding"]), np.array(w["embedding"])
            assert g.shape == (384,)
            np.testing.assert_allclose(g, w, atol=1e-5)

    errors = _lines(client, batch.error_file_id)
    by_code = {x["error"]["code"]: x for x in errors}
    assert set(by_code) == {"invalid_json", "invalid_request", "invalid_url", "model_not_found"}
    assert by_code["invalid_json"]["custom_id"] is None
    assert "line 3" in by_code["invalid_json"]["error"]["message"]
    assert by_code["invalid_request"]["response"]["status_code"] == 400
    assert by_code["model_not_found"]["response"]["status_code"] == 404
    assert by_code["invalid_url"]["custom_id"] == "other-url"

    output = client.files.retrieve(batch.output_file_id)  # type: ignore[arg-type]
    assert output.purpose == "batch_output" and output.bytes > 0
    assert batch.id in [b.id for b in client.batches.list().data]
    metrics = httpx.get(f"{base}/metrics", timeout=5).text
    assert 'inferq_batches_finished_total{status="completed"} 1.0' in metrics
    assert f'inferq_batch_lines_total{{result="succeeded"}} {len(good)}.0' in metrics


def test_a_killed_api_and_worker_lose_and_double_nothing(stack: Stack) -> None:
    slow = {"echo_batch_delay_ms": 30, "max_batch_size": 4}  # ~130 lines/s
    worker = stack.worker(**slow)
    base = stack.api(batch_in_flight=16)
    first = stack.procs[-1]
    client = _client(base)
    n = 300
    texts = {f"c{i}": f"line number {i} of the batch" for i in range(n)}
    lines = [_line(cid, {"input": t}) for cid, t in texts.items()]
    batch = client.batches.create(
        input_file_id=_upload(client, lines), endpoint="/v1/embeddings", completion_window="24h"
    )

    def completed() -> int:
        return int(stack.r.hget(keys.batch(batch.id), "completed") or 0)

    wait_for(lambda: completed() >= 40, 20, "40 lines done")
    first.signal(signal.SIGKILL)  # holding the lease, with 16 lines submitted
    worker.signal(signal.SIGKILL)  # and with some of them on its device
    first.wait(5)
    worker.wait(5)
    at_kill = completed()
    assert at_kill < n
    stack.worker(**slow)  # same consumer name: it re-reads its pending entries first
    client = _client(stack.api(batch_in_flight=16))  # takes the batch once the lease lapses
    batch = _finished(client, batch.id, timeout_s=40)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None and batch.request_counts.completed == n
    assert batch.error_file_id is None
    out = _by_id(_lines(client, batch.output_file_id))
    assert set(out) == set(texts)
    for cid, text in texts.items():
        vec = out[cid]["response"]["body"]["data"][0]["embedding"]
        assert vec == expected_vector(text), cid
    # Every line was submitted once: the new holder found the old holder's jobs by key.
    assert len(stack.r.keys(keys.job("*"))) == n


def test_cancelled_while_its_holder_is_dead(stack: Stack) -> None:
    stack.worker(echo_batch_delay_ms=1000, max_batch_size=1)  # 1 line/s: most stay queued
    base = stack.api(batch_in_flight=16)
    first = stack.procs[-1]
    client = _client(base)
    n = 40
    lines = [_line(f"c{i}", {"input": f"slow line {i}"}) for i in range(n)]
    batch = client.batches.create(
        input_file_id=_upload(client, lines), endpoint="/v1/embeddings", completion_window="24h"
    )

    def recorded() -> int:
        return int(stack.r.hlen(keys.batch_results(batch.id)))

    wait_for(lambda: recorded() >= 1, 20, "a line done")
    first.signal(signal.SIGKILL)
    first.wait(5)
    at_kill = recorded()
    client = _client(stack.api(batch_in_flight=16))
    assert client.batches.cancel(batch.id).status == "cancelling"  # nobody holds it yet
    # The new holder finds the dead one's jobs by their keys, cancels the queued ones and
    # keeps the outputs of those that ran.
    batch = _finished(client, batch.id, timeout_s=30)
    assert batch.status == "cancelled", batch
    out, errors = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)
    assert set(_by_id(out + errors)) == {f"c{i}" for i in range(n)}
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    # What ran is kept; the dead holder's jobs still queued at the takeover were cancelled.
    assert at_kill <= len(out) < at_kill + 16
    assert int(stack.r.get(keys.queued_items("echo")) or 0) == 0  # nothing left queued
    # Adopting found the dead holder's jobs: no line got a second one.
    assert len(stack.r.keys(keys.job("*"))) <= at_kill + 16


def test_tenants_and_refusals(stack: Stack) -> None:
    base = stack.api(
        api_keys="alpha:key-a-0123456789,beta:key-b-0123456789",
        max_batch_file_bytes=4000,
        max_body_bytes=2000,
        max_batch_lines=20,
    )
    a, b = _client(base, "key-a-0123456789"), _client(base, "key-b-0123456789")
    lines = [_line(f"c{i}", {"input": f"text {i} " + "x" * 100}) for i in range(20)]
    data = b"\n".join(lines)
    assert 2000 < len(data) < 4000  # over INFERQ_MAX_BODY_BYTES: uploads have their own limit
    fid = _upload(a, lines)
    batch = a.batches.create(input_file_id=fid, endpoint="/v1/embeddings", completion_window="24h")

    for call in (
        lambda: b.files.retrieve(fid),
        lambda: b.files.content(fid),
        lambda: b.files.delete(fid),
        lambda: b.batches.retrieve(batch.id),
        lambda: b.batches.cancel(batch.id),
        lambda: b.batches.create(
            input_file_id=fid, endpoint="/v1/embeddings", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert b.files.list().data == [] and b.batches.list().data == []
    assert [f.id for f in a.files.list().data] == [fid]
    assert [x.id for x in a.batches.list().data] == [batch.id]
    assert httpx.get(f"{base}/v1/batches", timeout=5).status_code == 401

    with pytest.raises(openai.APIStatusError) as e:
        a.files.create(file=("big.jsonl", io.BytesIO(b"x" * 4001)), purpose="batch")
    assert e.value.status_code == 413 and "INFERQ_MAX_BATCH_FILE_BYTES=4000" in str(e.value)
    with pytest.raises(openai.APIStatusError) as e:  # refused before the body is read
        a.files.create(file=("huge.jsonl", io.BytesIO(b"x" * 200_000)), purpose="batch")
    assert e.value.status_code == 413
    with pytest.raises(openai.UnprocessableEntityError, match="'fine-tune'"):
        a.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="fine-tune")
    with pytest.raises(openai.UnprocessableEntityError, match="'/v1/chat/completions'"):
        a.batches.create(
            input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h"
        )
    with pytest.raises(openai.UnprocessableEntityError, match="INFERQ_MAX_BATCH_LINES=20"):
        a.batches.create(
            input_file_id=_upload(a, [*lines[:15], *lines[:6]]),
            endpoint="/v1/embeddings",
            completion_window="24h",
        )
    with pytest.raises(openai.UnprocessableEntityError, match="'c1' is on lines 2 and 4"):
        a.batches.create(
            input_file_id=_upload(a, [lines[0], lines[1], lines[2], lines[1]]),
            endpoint="/v1/embeddings",
            completion_window="24h",
        )
    with pytest.raises(openai.ConflictError, match="still running"):
        a.files.delete(fid)  # the input of a batch not ended


def test_infer_batch_cancel_and_expiry(stack: Stack) -> None:
    stack.worker(echo_batch_delay_ms=40, max_batch_size=2)  # ~50 lines/s
    base = stack.api(batch_in_flight=4)
    client = _client(base)

    # /v1/infer lines get what POST /v1/infer answers
    bodies = {f"i{i}": {"inputs": [f"infer {i}", "second"]} for i in range(4)}
    lines = [_line(cid, body, url="/v1/infer") for cid, body in bodies.items()]
    lines.append(_line("both", {"input": "a", "inputs": ["b"]}, url="/v1/infer"))  # 422
    done = _finished(
        client,
        client.batches.create(
            input_file_id=_upload(client, lines), endpoint="/v1/infer", completion_window="24h"
        ).id,
    )
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (4, 1)
    out = _by_id(_lines(client, done.output_file_id))
    for cid, body in bodies.items():
        got = out[cid]["response"]["body"]
        want = httpx.post(f"{base}/v1/infer", json=body, timeout=20).json()
        assert got["status"] == want["status"] == "succeeded"
        assert got["outputs"] == want["outputs"] == [expected_vector(t) for t in body["inputs"]]
        assert set(got) == set(want)
    (bad,) = _lines(client, done.error_file_id)
    assert bad["custom_id"] == "both" and bad["response"]["status_code"] == 422
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(done.id)

    # cancel: what finished is in the output, everything else is in the error file
    n = 200
    lines = [_line(f"c{i}", {"input": f"cancel me {i}"}) for i in range(n)]
    batch = client.batches.create(
        input_file_id=_upload(client, lines), endpoint="/v1/embeddings", completion_window="24h"
    )
    wait_for(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 5, 20, "5 done")  # type: ignore[union-attr]
    assert client.batches.cancel(batch.id).status == "cancelling"
    batch = _finished(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at and batch.cancelling_at
    out, errors = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)
    assert set(_by_id(out + errors)) == {f"c{i}" for i in range(n)}
    assert 5 <= len(out) < n and {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(out), len(errors))

    # expiry: past its completion window a batch ends `expired`
    lines = [_line(f"e{i}", {"input": f"expire me {i}"}) for i in range(100)]
    batch = client.batches.create(
        input_file_id=_upload(client, lines), endpoint="/v1/embeddings", completion_window="24h"
    )
    wait_for(lambda: client.batches.retrieve(batch.id).status == "in_progress", 10, "running")
    stack.r.hset(keys.batch(batch.id), "expires_at", int(time.time()) - 1)
    batch = _finished(client, batch.id)
    assert batch.status == "expired" and batch.expired_at
    errors = _lines(client, batch.error_file_id)
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert len(_lines(client, batch.output_file_id)) + len(errors) == 100


def test_batches_on_a_cluster(cstack: Stack) -> None:
    """A batch's keys share its tag, a file's its own; the tenant indexes and the active
    set are elsewhere. A cluster refuses any script or MULTI across slots (CROSSSLOT), so
    this runs every one of them: create, run, record, finish, list, cancel, delete."""
    stack = cstack
    stack.worker(echo_batch_delay_ms=20, max_batch_size=4)
    client = _client(stack.api(batch_in_flight=8))
    texts = {f"c{i}": f"cluster line {i}" for i in range(30)}
    lines = [_line(cid, {"input": t}) for cid, t in texts.items()]
    fid = _upload(client, [*lines, b"{not json"])
    batch = client.batches.create(
        input_file_id=fid, endpoint="/v1/embeddings", completion_window="24h"
    )
    assert [b.id for b in client.batches.list().data] == [batch.id]
    batch = _finished(client, batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (30, 1)
    out = _by_id(_lines(client, batch.output_file_id))
    assert {cid: x["response"]["body"]["data"][0]["embedding"] for cid, x in out.items()} == {
        cid: expected_vector(t) for cid, t in texts.items()
    }
    (bad,) = _lines(client, batch.error_file_id)
    assert bad["error"]["code"] == "invalid_json"
    listed = {f.id for f in client.files.list().data}
    assert listed == {fid, batch.output_file_id, batch.error_file_id}
    # The runner drops the ended batch from the active set (its own slot, a step after
    # FINISH); then its input may go.
    wait_for(lambda: not stack.r.smembers(keys.BATCHES_ACTIVE), 10, "no active batch")
    client.files.delete(fid)
    assert fid not in {f.id for f in client.files.list().data}

    slow = [_line(f"s{i}", {"input": f"slow {i}"}) for i in range(400)]
    fid = _upload(client, slow)
    batch = client.batches.create(
        input_file_id=fid, endpoint="/v1/embeddings", completion_window="24h"
    )
    with pytest.raises(openai.ConflictError, match="still running"):
        client.files.delete(fid)
    assert client.batches.cancel(batch.id).status == "cancelling"
    batch = _finished(client, batch.id)
    assert batch.status == "cancelled", batch
    both = _lines(client, batch.output_file_id) + _lines(client, batch.error_file_id)
    assert set(_by_id(both)) == {f"s{i}" for i in range(400)}
