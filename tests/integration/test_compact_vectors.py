"""Compact vectors through the real stack (redis-server, API and worker processes): every
`encoding_format` and `dimensions` on `/v1/embeddings`, msgpack answers of `/v1/infer` and
`GET /v1/jobs/{id}`, and `inferq.client` using them by default."""

from __future__ import annotations

import base64

import httpx
import msgpack
import numpy as np
import openai

from inferq.api.protocols import vectors
from inferq.client import AsyncClient, Client
from inferq.worker.models.echo import expected_vector
from tests.integration.stack import Stack

TEXTS = ["hello world", "a b c", "the quick brown fox jumps", "x"]
EXPECTED = np.array([expected_vector(t) for t in TEXTS], dtype=np.float32)
NESTED = "nested=tests.fixtures.models:MatryoshkaEcho"  # declares sizes (2, 4)
PACKED = {"Accept": "application/msgpack"}


def _embed(base: str, **body: object) -> httpx.Response:
    return httpx.post(f"{base}/v1/embeddings", json={"input": TEXTS} | body, timeout=20)


def _array(packed: dict[str, object]) -> np.ndarray:
    data, dtype, shape = packed["data"], packed["dtype"], packed["shape"]
    assert isinstance(data, bytes) and isinstance(dtype, str) and isinstance(shape, list)
    return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)


def test_each_encoding_format_over_http(stack: Stack) -> None:
    stack.worker()
    base = stack.api()
    for fmt in vectors.FORMATS:
        r = _embed(base, model="echo", encoding_format=fmt)
        assert r.status_code == 200, (fmt, r.text)
        rows = [d["embedding"] for d in r.json()["data"]]
        if fmt == "float":
            np.testing.assert_array_equal(rows, EXPECTED)
        elif fmt == "base64":
            np.testing.assert_array_equal(
                [np.frombuffer(base64.b64decode(s), "<f4") for s in rows], EXPECTED
            )
        else:
            assert rows == [row.tolist() for row in vectors.encode(EXPECTED, fmt)], fmt
    # Spelled out for one text: echo("x") = [1, 1, crc, 1], crc the largest by far.
    x = _embed(base, model="echo", input="x", encoding_format="int8").json()["data"][0]
    crc = expected_vector("x")[2]
    assert x["embedding"] == [round(127 / crc), round(127 / crc), 127, round(127 / crc)]
    ub = _embed(base, model="echo", input="x", encoding_format="ubinary").json()["data"][0]
    assert ub["embedding"] == [0b11110000]  # 4 positive components, zero-padded to 8 bits
    b = _embed(base, model="echo", input="x", encoding_format="binary").json()["data"][0]
    assert b["embedding"] == [0b11110000 - 128]
    # The official client, unchanged: its default (base64) and explicit float still agree.
    with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=20) as client:
        got = client.embeddings.create(model="echo", input=TEXTS)
    np.testing.assert_array_equal([d.embedding for d in got.data], EXPECTED)


def test_dimensions_on_a_declaring_and_a_non_declaring_model(stack: Stack) -> None:
    stack.worker()
    stack.worker(model=NESTED, models="nested")
    base = stack.api(models=f"echo,{NESTED}")
    r = _embed(base, model="nested", dimensions=2)
    assert r.status_code == 200, r.text
    head = EXPECTED[:, :2] / np.linalg.norm(EXPECTED[:, :2], axis=1, keepdims=True)
    got = np.array([d["embedding"] for d in r.json()["data"]])
    np.testing.assert_allclose(got, head, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)
    # dimensions, then the encoding: sign bits of the 2 kept components.
    bits = _embed(base, model="nested", dimensions=2, encoding_format="ubinary").json()
    assert [d["embedding"] for d in bits["data"]] == [[0b11000000]] * len(TEXTS)
    listed = httpx.get(f"{base}/v1/models", timeout=10).json()["models"]
    declared = {m["name"]: m.get("matryoshka_dims") for m in listed}
    assert declared == {"echo": [], "nested": [2, 4]}
    refused = [
        ("nested", 3, "takes one of 2, 4"),  # refused before it is queued
        ("nested", 8, "takes one of 2, 4"),
        ("echo", 2, "declares no Matryoshka sizes"),  # echo declares none
        ("echo", 5, "returns 4"),
    ]
    for model, n, says in refused:
        r = _embed(base, model=model, dimensions=n)
        assert r.status_code == 400, (model, n, r.text)
        err = r.json()["error"]
        assert err["param"] == "dimensions" and says in err["message"], err
    assert _embed(base, model="echo", dimensions=4).status_code == 200  # its own width


def test_msgpack_answers_of_infer_and_get_job_equal_the_json(stack: Stack) -> None:
    stack.worker()
    base = stack.api(models="echo,idle")  # idle: served, but no worker runs it
    body = {"inputs": TEXTS, "model": "echo"}
    as_json = httpx.post(f"{base}/v1/infer", json=body, timeout=20)
    r = httpx.post(f"{base}/v1/infer", json=body, headers=PACKED, timeout=20)
    assert r.status_code == 200 and r.headers["content-type"] == "application/msgpack"
    record = msgpack.unpackb(r.content)
    packed = record.pop("outputs")
    assert packed["dtype"] == "float32" and packed["shape"] == [len(TEXTS), 4]
    np.testing.assert_array_equal(_array(packed), as_json.json()["outputs"])
    expected = as_json.json()
    assert set(record) == set(expected) - {"outputs"}
    assert record["status"] == "succeeded" and record["items_total"] == len(TEXTS)
    # The job's own record, plain and long-polled, in msgpack.
    for params in ({}, {"wait": 5}):
        url = f"{base}/v1/jobs/{record['id']}"
        got = msgpack.unpackb(httpx.get(url, params=params, headers=PACKED, timeout=20).content)
        np.testing.assert_array_equal(_array(got.pop("outputs")), EXPECTED)
        plain = httpx.get(url, timeout=20).json()
        assert plain.pop("outputs") == EXPECTED.tolist()
        assert got == plain
    # Not final within `wait`: the 202 in msgpack too; errors stay JSON.
    idle = body | {"model": "idle", "wait": 0}
    queued = httpx.post(f"{base}/v1/infer", json=idle, headers=PACKED, timeout=20)
    assert queued.status_code == 202 and queued.headers["content-type"] == "application/msgpack"
    accepted = msgpack.unpackb(queued.content)
    assert accepted["status"] == "queued" and queued.headers["location"].endswith(accepted["id"])
    unknown = body | {"model": "nope"}
    missing = httpx.post(f"{base}/v1/infer", json=unknown, headers=PACKED, timeout=20)
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/json"
    bad = httpx.post(f"{base}/v1/infer", json={"inputs": []}, headers=PACKED, timeout=20)
    assert bad.status_code == 422 and bad.json()["error"]["code"]


class Seen(httpx.HTTPTransport):
    """The real transport, noting each answer's content type."""

    def __init__(self) -> None:
        super().__init__()
        self.types: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.types.append(response.headers.get("content-type", ""))
        return response


class AsyncSeen(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.types: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        self.types.append(response.headers.get("content-type", ""))
        return response


async def test_the_client_transfers_compactly_by_default(stack: Stack) -> None:
    stack.worker()
    base = stack.api()
    seen = Seen()
    with Client(base, transport=seen) as c:
        job = c.infer(TEXTS)
        again = c.get(job.id)
    assert seen.types == ["application/msgpack"] * 2
    for j in (job, again):
        assert isinstance(j.outputs, np.ndarray) and j.outputs.dtype == np.float32
        np.testing.assert_array_equal(j.outputs, EXPECTED)
    plain = Seen()
    with Client(base, transport=plain, compact=False) as c:
        as_json = c.get(job.id)
    assert plain.types == ["application/json"]
    assert as_json.to_dict() == again.to_dict()  # the same Job, whichever the wire
    aseen = AsyncSeen()
    async with AsyncClient(base, transport=aseen) as ac:
        ajob = await ac.infer(TEXTS)
    assert aseen.types == ["application/msgpack"]
    np.testing.assert_array_equal(ajob.outputs, EXPECTED)  # type: ignore[arg-type]
