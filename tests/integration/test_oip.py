"""The Open Inference Protocol (/v2) with the official Triton client, unchanged, against real
processes: health, metadata, infer with binary and with JSON tensors on echo, MiniLM (the
same vectors as /v1/embeddings) and efficientnet-lite0 (a real photo of a tabby cat); the
client's own errors for an unknown model, a bad tensor, a limit, a missing key; and the
pipeline's behaviour (admission, idempotency, cancel-on-disconnect) as on /v1/infer."""

from __future__ import annotations

import struct
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from inferq.shared import keys
from inferq.worker.models.echo import expected_vector
from tests.fixtures.images import photo
from tests.integration.stack import Stack, metric, wait_for

CATS = {281, 282, 285}  # tabby, tiger cat, Egyptian cat
EFFICIENTNET: dict[str, Any] = dict(model="efficientnet-lite0", models="efficientnet-lite0")
TEXTS = ["A man is playing a guitar.", "Someone plays the guitar.", "Stocks fell today."]


def _client(base: str) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url=base.removeprefix("http://"), network_timeout=60)


def _texts(values: list[str], binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput("text", [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=np.object_), binary_data=binary)
    return tensor


def _status(e: pytest.ExceptionInfo[InferenceServerException]) -> str | None:
    return e.value.status()


def test_health_metadata_and_readiness(stack: Stack) -> None:
    base = stack.api(models="echo,minilm")  # minilm is served but has no worker
    client = _client(base)
    assert client.is_server_live()
    assert not client.is_server_ready()  # no worker for the default model yet
    stack.worker()
    assert client.is_server_ready() and client.is_model_ready("echo")
    assert client.is_model_ready("echo", "1")
    assert not client.is_model_ready("minilm")
    server = client.get_server_metadata()
    assert server["name"] == "inferq" and "binary_tensor_data" in server["extensions"]
    meta = client.get_model_metadata("echo")
    assert meta["name"] == "echo" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "vector", "datatype": "FP32", "shape": [-1, -1]}]
    assert client.get_model_metadata("echo", "1") == meta
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("echo", "2")
    assert _status(e) == "404" and "version" in str(e.value)
    with pytest.raises(InferenceServerException) as e:  # served, but no worker declared it
        client.get_model_metadata("minilm")
    assert _status(e) == "503"
    # Beyond the subset: the protocol's error shape, so the client can say so.
    with pytest.raises(InferenceServerException) as e:
        client.get_model_repository_index()
    assert _status(e) == "404" and "not part of" in str(e.value)


def test_echo_binary_and_json_tensors_with_schedule_parameters(stack: Stack) -> None:
    stack.worker()
    client = _client(stack.api())
    texts = ["hello world", "a b c", "ünïcode ✓"]
    want = np.array([expected_vector(t) for t in texts], dtype=np.float32)
    for binary in (True, False):
        out = triton.InferRequestedOutput("vector", binary_data=binary)
        result = client.infer(
            "echo",
            [_texts(texts, binary)],
            outputs=[out],
            request_id=f"req-{binary}",
            priority=1,
            timeout=30_000_000,
        )
        np.testing.assert_array_equal(result.as_numpy("vector"), want)
        response = result.get_response()
        assert response["id"] == f"req-{binary}" and response["model_version"] == "1"
        assert ("parameters" in response["outputs"][0]) is binary  # binary_data_size or data
    # No outputs named: the client asks for binary outputs (binary_data_output).
    result = client.infer("echo", [_texts(texts)])
    np.testing.assert_array_equal(result.as_numpy("vector"), want)
    # Answered in the response (this protocol has no later read): kept briefly, not an hour.
    records = stack.r.zrange(keys.tenant_jobs("echo", 0, 1, "", brief=True), 0, -1)
    assert len(records) == 3 and all(0 < stack.r.ttl(k) <= 120 for k in records)
    # Request parameters go to the model: echo declares none, so this one is refused.
    with pytest.raises(InferenceServerException) as e:
        client.infer("echo", [_texts(texts)], parameters={"temperature": 1})
    assert _status(e) == "400" and "temperature" in str(e.value)


def test_minilm_vectors_equal_the_embeddings_endpoints(stack: Stack) -> None:
    stack.worker(model="minilm", models="minilm")
    base = stack.api(model="minilm")
    client = _client(base)
    r = httpx.post(f"{base}/v1/embeddings", json={"input": TEXTS}, timeout=60)
    assert r.status_code == 200, r.text
    want = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    assert want.shape == (3, 384)
    for binary in (True, False):
        result = client.infer(
            "minilm",
            [_texts(TEXTS, binary)],
            outputs=[triton.InferRequestedOutput("vector", binary_data=binary)],
        )
        got = result.as_numpy("vector")
        assert got.shape == (3, 384) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert client.get_model_metadata("minilm")["inputs"][0]["name"] == "text"


def test_efficientnet_on_a_real_photo(stack: Stack) -> None:
    stack.worker(**EFFICIENTNET)
    client = _client(stack.api(**EFFICIENTNET))
    meta = client.get_model_metadata("efficientnet-lite0")
    assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "labels", "datatype": "BYTES", "shape": [-1, -1]}]
    assert "top_k" in meta["parameters"]
    image = triton.InferInput("image", [2], "BYTES")
    image.set_data_from_numpy(np.array([photo("chelsea"), photo("coffee", "PNG")], dtype=object))
    out = triton.InferRequestedOutput("labels", class_count=3)
    labels = client.infer("efficientnet-lite0", [image], outputs=[out]).as_numpy("labels")
    assert labels.shape == (2, 3)
    cat = [c.decode().split(":", 2) for c in labels[0]]
    assert int(cat[0][1]) in CATS and cat[0][2] in {"tabby", "tiger cat", "Egyptian cat"}
    scores = [float(c[0]) for c in cat]
    assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1
    assert labels[1][0].decode().endswith(":967:espresso")
    # `top_k` as a request parameter, and labels in JSON.
    out = triton.InferRequestedOutput("labels", binary_data=False)
    result = client.infer("efficientnet-lite0", [image], outputs=[out], parameters={"top_k": 1})
    assert result.as_numpy("labels").shape == (2, 1)


def test_tensor_rows_become_tensor_inputs(stack: Stack) -> None:
    stack.worker(model="tsum=tests.fixtures.models:TensorSum", models="tsum")
    client = _client(stack.api(model="tsum", models="tsum"))
    meta = client.get_model_metadata("tsum")
    assert meta["inputs"] == [{"name": "tensor", "datatype": "FP32", "shape": [-1, -1]}]
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    for datatype, array, binary in (("FP32", rows, True), ("INT64", rows.astype(np.int64), False)):
        tensor = triton.InferInput("tensor", [2, 3], datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        out = client.infer("tsum", [tensor]).as_numpy("output")  # one JSON document per row
        assert [orjson.loads(v) for v in out] == [
            {"sum": 3.0, "shape": [3]},
            {"sum": 12.0, "shape": [3]},
        ]


def test_what_the_client_raises_for_refusals(stack: Stack) -> None:
    stack.worker()
    client = _client(stack.api(max_inputs_per_job=2))
    with pytest.raises(InferenceServerException) as e:
        client.infer("nope", [_texts(["x"])])
    assert _status(e) == "404" and "'nope' is not served" in str(e.value)
    with pytest.raises(InferenceServerException) as e:  # over INFERQ_MAX_INPUTS_PER_JOB
        client.infer("echo", [_texts(["a", "b", "c"])])
    assert _status(e) == "413" and "INFERQ_MAX_INPUTS_PER_JOB=2" in str(e.value)
    bad = triton.InferInput("image", [1], "BYTES")  # echo takes text
    bad.set_data_from_numpy(np.array([b"x"], dtype=object))
    with pytest.raises(InferenceServerException) as e:
        client.infer("echo", [bad])
    assert _status(e) == "400" and "no input 'image'" in str(e.value)
    floats = triton.InferInput("text", [1], "FP32")
    floats.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("echo", [floats])
    assert _status(e) == "400" and "must be BYTES" in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        client.infer("echo", [_texts(["a"])], outputs=[triton.InferRequestedOutput("logits")])
    assert _status(e) == "400" and "no output 'logits'" in str(e.value)


def test_a_tenants_key_via_headers(stack: Stack) -> None:
    stack.worker()
    base = stack.api(api_keys="acme:key-acme-0123456789")
    client = _client(base)
    assert client.is_server_live() and client.is_server_ready()  # open, as /healthz, /readyz
    with pytest.raises(InferenceServerException) as e:
        client.infer("echo", [_texts(["hi"])])
    assert _status(e) == "401"
    with pytest.raises(InferenceServerException) as e:
        client.infer("echo", [_texts(["hi"])], headers={"Authorization": "Bearer wrong"})
    assert _status(e) == "401"
    auth = {"Authorization": "Bearer key-acme-0123456789"}
    result = client.infer("echo", [_texts(["hi"])], headers=auth)
    np.testing.assert_array_equal(result.as_numpy("vector")[0], expected_vector("hi"))
    assert client.get_model_metadata("echo", headers=auth)["name"] == "echo"
    assert client.is_model_ready("echo", headers=auth)


# --- the bytes on the wire, and the pipeline's behaviour, with a plain HTTP client ---
def _binary_body(name: str, elements: list[bytes], size: int | None = None) -> tuple[bytes, dict]:
    raw = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "BYTES",
                    "shape": [len(elements)],
                    "parameters": {"binary_data_size": len(raw) if size is None else size},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


def test_binary_framing_and_malformed_bodies(stack: Stack) -> None:
    stack.worker()
    base = stack.api()
    url = f"{base}/v2/models/echo/infer"
    body, headers = _binary_body("text", [b"hello world", b"a b c"])
    r = httpx.post(url, content=body, headers=headers, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    n = int(r.headers["inference-header-content-length"])
    head = orjson.loads(r.content[:n])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 2 * 4 * 4
    got = np.frombuffer(r.content[n:], dtype="<f4").reshape(2, 4)
    np.testing.assert_array_equal(got, [expected_vector("hello world"), expected_vector("a b c")])
    cases = [
        (*_binary_body("text", [b"abc"], size=3), "truncated"),  # its length prefix is cut
        (*_binary_body("text", [b"abc"], size=99), "binary_data_size 99"),
        (body + b"extra", headers, "5 left over"),  # sizes do not add up to the body
        (body, {"Inference-Header-Content-Length": "999999"}, "Inference-Header-Content-Length"),
        (b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a"]}]}',
         {}, "does not match shape [2]"),
    ]  # fmt: skip
    for bad, bad_headers, why in cases:
        r = httpx.post(url, content=bad, headers=bad_headers, timeout=30)
        assert r.status_code == 400, r.text
        assert isinstance(r.json()["error"], str) and why in r.json()["error"], r.text
    r = httpx.post(url, content=b"{", timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["error"]


def _json_infer(text: str, **parameters: object) -> dict:
    tensor = {"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}
    return {"inputs": [tensor], "parameters": parameters}


def test_admission_answers_429_with_retry_after_and_is_counted(stack: Stack) -> None:
    base = stack.api(max_queue=1)  # no worker: the first job stays queued
    assert httpx.post(f"{base}/v1/jobs", json={"input": "first"}, timeout=10).status_code == 202
    r = httpx.post(f"{base}/v2/models/echo/infer", json=_json_infer("second"), timeout=10)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
    assert "INFERQ_MAX_QUEUE=1" in r.json()["error"]
    assert metric(base, "inferq_jobs_rejected_total", model="echo", reason="queue_full") == 1
    assert metric(base, "inferq_jobs_submitted_total", model="echo") == 1


def test_the_wait_and_the_deadline_and_the_idempotency_key(stack: Stack) -> None:
    base = stack.api(sync_wait_s=0.3)  # no worker: nothing starts a job
    url = f"{base}/v2/models/echo/infer"
    late = {"Idempotency-Key": "oip-late"}
    r = httpx.post(url, json=_json_infer("nobody runs this"), headers=late, timeout=10)
    assert r.status_code == 429 and "did not finish within 0.3 s" in r.json()["error"], r.text
    assert int(r.headers["retry-after"]) >= 1
    again = {"input": "nobody runs this"}  # the same request: a key is bound to its request
    same = httpx.post(f"{base}/v1/jobs", json=again, headers=late, timeout=10).json()
    assert same["status"] == "cancelled"  # the same job, dropped before any worker took it
    # `timeout` (µs) is the job's deadline, `priority` 3 its lane (low).
    due = {"Idempotency-Key": "oip-deadline"}
    body = _json_infer("nor this", timeout=200_000, priority=3)
    r = httpx.post(url, json=body, headers=due, timeout=10)
    assert r.status_code == 429 and "deadline passed" in r.json()["error"], r.text
    same = httpx.post(f"{base}/v1/jobs", json={"input": "nor this"}, headers=due, timeout=10)
    assert same.json()["status"] == "expired"
    assert stack.r.xlen(keys.stream("echo", lane="low")) == 1


def test_a_client_that_leaves_cancels_its_unstarted_job(stack: Stack) -> None:
    base = stack.api()  # no worker: nothing starts the job
    headers = {"Idempotency-Key": "oip-leaves"}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            f"{base}/v2/models/echo/infer", json=_json_infer("bye"), headers=headers, timeout=0.5
        )

    def cancelled() -> bool:
        r = httpx.post(f"{base}/v1/jobs", json={"input": "bye"}, headers=headers, timeout=10)
        return r.json()["status"] == "cancelled"

    wait_for(cancelled, 10, "the job to be cancelled")
