"""Batch API pieces without Redis or processes: line parsing, output shapes, the endpoint
adapters (they must answer exactly as the routes do), the OpenAI object shapes, and the
file routes on fakeredis (they need no Lua)."""

from __future__ import annotations

import io
import time

import fakeredis
import numpy as np
import openai.types
import orjson
import pytest
from fastapi.testclient import TestClient

from inferq.api.batches import lines as bl
from inferq.api.batches.files import FileRecord, FileStore
from inferq.api.batches.store import BatchRecord, output_ids
from inferq.api.middleware import FRAMING_BYTES, UploadLimit
from inferq.api.protocols import embeddings
from inferq.api.protocols.embeddings import Answer, EmbeddingsRequest
from inferq.api.protocols.v1 import JobBody
from inferq.api.responses import FastJSON
from inferq.shared import keys
from inferq.shared.errors import InputInvalid, InputTooLarge, ModelNotServed, Overloaded
from inferq.shared.jobs import ErrorCode, Job, JobError, Status
from tests.unit.api.conftest import MakeApp

EP = "/v1/embeddings"


def _line(obj: object, n: int = 1) -> bl.Line:
    return bl.Line(n, orjson.dumps(obj))


def _req(cid: str, body: object, url: str = EP, method: str = "POST") -> dict[str, object]:
    return {"custom_id": cid, "method": method, "url": url, "body": body}


# --- lines ---


def test_lines_are_numbered_by_position_and_blank_ones_skipped() -> None:
    lines = bl.split_lines(b'{"a":1}\n\n  \n{"b":2}\n')
    assert [(line.number, line.raw) for line in lines] == [(1, b'{"a":1}'), (4, b'{"b":2}')]
    assert bl.split_lines(b"") == []


def test_envelope_takes_a_good_line() -> None:
    env = bl.envelope(_line(_req("x", {"input": "hi"})), EP)
    assert env.custom_id == "x" and orjson.loads(env.body) == {"input": "hi"}


@pytest.mark.parametrize(
    ("raw", "code", "cid"),
    [
        (b"{nope", "invalid_json", None),
        (b"[1, 2]", "invalid_request", None),
        (orjson.dumps(_req("", {"input": "a"})), "missing_custom_id", None),
        (orjson.dumps({"method": "POST", "url": EP, "body": {}}), "missing_custom_id", None),
        (orjson.dumps(_req("c", {"input": "a"}, method="GET")), "invalid_method", "c"),
        (orjson.dumps(_req("c", {"input": "a"}, url="/v1/infer")), "invalid_url", "c"),
        (orjson.dumps(_req("c", "text")), "invalid_request", "c"),
    ],
)
def test_envelope_names_what_is_wrong(raw: bytes, code: str, cid: str | None) -> None:
    with pytest.raises(bl.LineError) as e:
        bl.envelope(bl.Line(7, raw), EP)
    assert e.value.code == code and e.value.custom_id == cid
    assert "line 7" in str(e.value)


def test_check_file() -> None:
    good = b"\n".join(orjson.dumps(_req(f"c{i}", {"input": "a"})) for i in range(3))
    assert bl.check_file(good + b"\n{broken\n", 4, 1000) == 4  # a broken line: its own error
    with pytest.raises(InputInvalid, match=r"more than 2 requests \(INFERQ_MAX_BATCH_LINES=2\)"):
        bl.check_file(good, 2, 1000)
    with pytest.raises(InputInvalid, match="no requests"):
        bl.check_file(b"\n \n", 2, 1000)
    dup = good + b"\n" + orjson.dumps(_req("c1", {"input": "b"}))
    with pytest.raises(InputInvalid, match="'c1' is on lines 2 and 4"):
        bl.check_file(dup, 10, 1000)
    # A line over the value budget is never parsed: a duplicate id inside it goes unseen,
    # and the runner refuses that line alone.
    big = orjson.dumps(_req("c1", {"input": ["a"] * 50}))
    assert bl.check_file(good + b"\n" + big, 10, 20) == 4
    with pytest.raises(bl.LineError, match="INFERQ_MAX_JSON_VALUES=20") as e:
        bl.envelope(bl.Line(4, big), EP, 20)
    assert e.value.code == "too_large"
    # Nor is it parsed for its custom_id when the run records it as not run (cancel, expiry).
    assert bl.custom_id_of(bl.Line(4, big), 20) is None
    assert bl.custom_id_of(bl.Line(4, big), 1000) == "c1"


def test_lines_are_numbered_by_position_and_read_lazily() -> None:
    content = b"\n\na\n  \nb\r\n\n\nc"
    assert [(x.number, x.raw) for x in bl.iter_lines(content)] == [
        (3, b"a"),
        (5, b"b\r"),
        (8, b"c"),
    ]
    lines = bl.iter_lines(b"x\n" * 10_000_000)  # 20 MB: nothing is built before it is asked
    assert next(lines).number == 1 and next(lines).number == 2


def test_blank_lines_cost_no_python_step_each() -> None:
    """16 MB of lines holding only blanks: skipped inside the regex engine (~0.1 s), not a
    Python step each (~5 s here before). The bound is generous for a slow CI box."""
    blank = b" \t\r\n" * 4_000_000
    assert [(x.number, x.raw) for x in bl.iter_lines(b" \n\t x \n" + blank + b"y")] == [
        (2, b"\t x "),
        (4_000_003, b"y"),
    ]
    t0 = time.perf_counter()
    with pytest.raises(InputInvalid, match="no requests"):
        bl.check_file(blank, 10, 1000)
    assert time.perf_counter() - t0 < 1.0


# --- output and error lines ---


def test_result_and_error_line_shapes() -> None:
    vec = np.array([[1.5, 2.0]], np.float32)
    ok = Answer(200, {"object": "list", "data": [{"embedding": vec[0]}]})
    kind, raw = bl.result_line("batch_1", 3, "c3", ok, "job-3")
    line = orjson.loads(raw)
    assert kind == bl.OK
    assert line == {
        "id": bl.request_id("batch_1", 3),
        "custom_id": "c3",
        "response": {
            "status_code": 200,
            "request_id": "job-3",
            "body": {"object": "list", "data": [{"embedding": [1.5, 2.0]}]},
        },
        "error": None,
    }
    # the same bytes the route would send for that body
    assert orjson.dumps(line["response"]["body"]) == FastJSON(ok.body).body
    assert bl.result_line("batch_1", 3, "c3", ok, "job-3")[1] == raw  # deterministic
    assert bl.request_id("batch_1", 3) != bl.request_id("batch_1", 4)
    assert bl.request_id("batch_1", 3).startswith("batch_req_")

    refused = embeddings.refusal(ModelNotServed("model 'x' is not served here"))
    kind, raw = bl.result_line("batch_1", 4, "c4", refused, None)
    line = orjson.loads(raw)
    assert kind == bl.ERROR and line["response"]["status_code"] == 404
    assert line["error"] == {"code": "model_not_found", "message": "model 'x' is not served here"}

    kind, raw = bl.error_line("batch_1", 5, None, "invalid_json", "line 5 is not JSON")
    line = orjson.loads(raw)
    assert kind == bl.ERROR and line["response"] is None and line["custom_id"] is None
    assert line["error"] == {"code": "invalid_json", "message": "line 5 is not JSON"}


# --- endpoints: exactly what the routes do ---


def _job(outputs: np.ndarray | None = None, **kw: object) -> Job:
    job = Job(id="j1", model="echo", inputs=["a b", "c"], **kw)  # type: ignore[arg-type]
    job.outputs = outputs
    return job


def test_embeddings_endpoint() -> None:
    ep = bl.ENDPOINTS["/v1/embeddings"]
    bad = ep.parse(b'{"input": []}')
    assert isinstance(bad, Answer) and bad.status == 400
    assert bad.body["error"]["code"] == "invalid_request"
    req = ep.parse(b'{"input": ["a b", "c"], "model": "echo", "encoding_format": "base64"}')
    assert isinstance(req, EmbeddingsRequest)
    sub = ep.submission(req, "t", priority="low", idempotency_key="k", timeout_s=9.0)
    assert (sub.items, sub.model, sub.tenant) == (["a b", "c"], "echo", "t")
    assert (sub.priority, sub.idempotency_key, sub.timeout_s) == ("low", "k", 9.0)
    out = np.arange(8, dtype=np.float32).reshape(2, 4)
    ans = ep.answer(req, _job(out, status=Status.SUCCEEDED))
    assert ans == embeddings.answer(req, _job(out, status=Status.SUCCEEDED))
    assert ans.status == 200 and ans.body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert isinstance(ans.body["data"][0]["embedding"], str)  # base64, as asked
    failed = ep.answer(req, _job(status=Status.FAILED, error=JobError(ErrorCode.TOO_LARGE, "big")))
    assert failed.status == 413 and failed.body["error"]["code"] == "too_large"
    full = ep.refusal(Overloaded("full", 3))
    assert full.status == 429 and full.headers == {"Retry-After": "3"}


def test_infer_endpoint() -> None:
    ep = bl.ENDPOINTS["/v1/infer"]
    bad = ep.parse(b'{"input": "a", "inputs": ["b"]}')
    assert isinstance(bad, Answer) and bad.status == 422
    assert bad.body["error"]["code"] == "invalid_request" and bad.body["detail"]
    hook = ep.parse(b'{"input": "a", "webhook": {"url": "https://example.com/h"}}')
    assert isinstance(hook, Answer) and "webhook" in hook.body["error"]["message"]
    req = ep.parse(b'{"inputs": ["a"], "priority": "high", "timeout_s": 5, "parameters": {}}')
    assert isinstance(req, JobBody)
    sub = ep.submission(req, "t", priority="low", idempotency_key="k", timeout_s=60.0)
    assert (
        sub.priority == "low" and sub.timeout_s == 5
    )  # the lane is the batch's, the deadline the sooner
    ok = ep.answer(req, _job(np.ones((1, 4), np.float32), status=Status.SUCCEEDED))
    assert ok.status == 200 and ok.body["status"] == "succeeded"
    expired = ep.answer(req, _job(status=Status.EXPIRED, error=JobError(ErrorCode.EXPIRED, "late")))
    assert expired.status == 429 and expired.body["error"]["code"] == "expired"
    too_big = ep.refusal(InputTooLarge("300 inputs"))
    assert too_big.status == 413 and too_big.body == {
        "error": {"code": "input_rejected", "message": "300 inputs"}
    }


# --- OpenAI's object shapes ---


def test_objects_validate_as_openai_types() -> None:
    rec = FileRecord("file-1", "t", "in.jsonl", "batch", 12, 100, 200)
    assert openai.types.FileObject.model_validate(rec.view()).bytes == 12
    fields = {
        "id": "batch_1", "tenant": "t", "status": "in_progress", "endpoint": EP,
        "input_file_id": "file-1", "completion_window": "24h", "created_at": "100",
        "expires_at": "86500", "in_progress_at": "101", "total": "3", "completed": "1",
        "failed": "1", "metadata": '{"k":"v"}', "output_file_id": "", "error_file_id": "",
    }  # fmt: skip
    batch = openai.types.Batch.model_validate(BatchRecord(fields).view())
    assert batch.request_counts is not None and batch.request_counts.total == 3
    assert batch.in_progress_at == 101 and batch.completed_at is None
    assert batch.metadata == {"k": "v"} and batch.output_file_id is None
    out, err = output_ids("batch_1")
    assert out != err and out.startswith("file-") and output_ids("batch_1") == (out, err)


# --- the body limit by route ---


async def test_upload_limit_routes_by_path() -> None:
    seen: list[str] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        seen.append(scope["path"])
        await FastJSON({})(scope, receive, send)

    limit = UploadLimit(app, max_body_bytes=10, max_file_bytes=1000)
    sent: list[dict[str, object]] = []

    async def send(message):  # type: ignore[no-untyped-def]
        sent.append(message)

    async def receive():  # type: ignore[no-untyped-def]
        return {"type": "http.request", "body": b"", "more_body": False}

    def scope(method: str, path: str, length: int) -> dict[str, object]:
        headers = [(b"content-length", str(length).encode())]
        return {"type": "http", "method": method, "path": path, "headers": headers}

    await limit(scope("POST", "/v1/files", 900 + FRAMING_BYTES), receive, send)
    await limit(scope("POST", "/v1/jobs", 900), receive, send)
    await limit(scope("POST", "/v1/files", 1001 + FRAMING_BYTES), receive, send)
    statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
    assert statuses == [200, 413, 413] and seen == ["/v1/files"]
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert b"INFERQ_MAX_BODY_BYTES=10" in bodies[1]
    assert b"INFERQ_MAX_BATCH_FILE_BYTES=1000" in bodies[2]


# --- the file routes on fakeredis ---


@pytest.fixture
def client(make_app: MakeApp) -> TestClient:
    return make_app(
        api_keys="alpha:ka-0123456789abcdef,beta:kb-0123456789abcdef",
        max_batch_file_bytes=3000,
        max_body_bytes=1000,
    ).client


def _upload(c: TestClient, key: str, data: bytes, purpose: str = "batch"):  # type: ignore[no-untyped-def]
    return c.post(
        "/v1/files",
        files={"file": ("in.jsonl", io.BytesIO(data))},
        data={"purpose": purpose},
        headers={"authorization": f"Bearer {key}"},
    )


def test_files_by_tenant(client: TestClient) -> None:
    a, b = (
        {"authorization": "Bearer ka-0123456789abcdef"},
        {"authorization": "Bearer kb-0123456789abcdef"},
    )
    data = b"x" * 2000  # over INFERQ_MAX_BODY_BYTES: uploads have their own limit
    r = _upload(client, "ka-0123456789abcdef", data)
    assert r.status_code == 200, r.text
    f = r.json()
    assert f["bytes"] == 2000 and f["purpose"] == "batch" and f["id"].startswith("file-")
    assert client.get(f"/v1/files/{f['id']}", headers=a).json() == f
    assert client.get(f"/v1/files/{f['id']}/content", headers=a).content == data
    assert [x["id"] for x in client.get("/v1/files", headers=a).json()["data"]] == [f["id"]]
    for path in (f"/v1/files/{f['id']}", f"/v1/files/{f['id']}/content"):
        assert client.get(path, headers=b).status_code == 404
    assert client.delete(f"/v1/files/{f['id']}", headers=b).status_code == 404
    assert client.get("/v1/files", headers=b).json()["data"] == []
    assert client.get("/v1/files").status_code == 401
    assert client.delete(f"/v1/files/{f['id']}", headers=a).json()["deleted"] is True
    assert client.get(f"/v1/files/{f['id']}", headers=a).status_code == 404


def test_upload_refusals(client: TestClient) -> None:
    r = _upload(client, "ka-0123456789abcdef", b"x" * 3001)
    assert r.status_code == 413 and "INFERQ_MAX_BATCH_FILE_BYTES=3000" in r.text
    r = _upload(client, "ka-0123456789abcdef", b"{}", purpose="fine-tune")
    assert r.status_code == 422 and "'fine-tune'" in r.json()["error"]["message"]
    r = client.post(
        "/v1/files",
        json={"purpose": "batch"},
        headers={"authorization": "Bearer ka-0123456789abcdef"},
    )
    assert r.status_code == 422 and "multipart" in r.json()["error"]["message"]


def test_batch_refusals(client: TestClient) -> None:
    a = {"authorization": "Bearer ka-0123456789abcdef"}
    line = orjson.dumps(_req("c", {"input": "a"}))
    fid = _upload(client, "ka-0123456789abcdef", line + b"\n" + line).json()["id"]
    body = {"input_file_id": fid, "endpoint": EP, "completion_window": "24h"}
    cases = [
        ({"endpoint": "/v1/chat/completions"}, 422, "'/v1/chat/completions'"),
        ({"completion_window": "48h"}, 422, "'48h'"),
        ({}, 422, "'c' is on lines 1 and 2"),
        ({"input_file_id": "file-nope"}, 404, "file-nope"),
        ({"metadata": {str(i): "v" for i in range(17)}}, 422, "16 pairs"),
    ]
    for change, status, text in cases:
        r = client.post("/v1/batches", json=body | change, headers=a)
        assert r.status_code == status and text in r.json()["error"]["message"], (change, r.text)
    assert client.get("/v1/batches/batch_nope", headers=a).status_code == 404
    assert client.get("/v1/batches", headers=a).json()["data"] == []


def test_file_quotas_name_their_setting(make_app: MakeApp) -> None:
    c = make_app(
        api_keys="alpha:ka-0123456789abcdef,beta:kb-0123456789abcdef",
        tenant_max_files=2,
        tenant_max_file_bytes=1000,
    ).client
    assert _upload(c, "ka-0123456789abcdef", b"x" * 600).status_code == 200
    r = _upload(c, "ka-0123456789abcdef", b"x" * 500)
    assert r.status_code == 429 and r.headers["retry-after"]
    assert "INFERQ_TENANT_MAX_FILE_BYTES=1000" in r.json()["error"]["message"]
    assert (
        _upload(c, "kb-0123456789abcdef", b"x" * 500).status_code == 200
    )  # beta's quota is its own
    kept = _upload(c, "ka-0123456789abcdef", b"x" * 400).json()[
        "id"
    ]  # 2 files, 1000 bytes: full, not over
    r = _upload(c, "ka-0123456789abcdef", b"x")
    assert r.status_code == 429 and "INFERQ_TENANT_MAX_FILES=2" in r.json()["error"]["message"]
    # Refused before the upload is read: a form without 'purpose' gets the 429, not a 422.
    a = {"authorization": "Bearer ka-0123456789abcdef"}
    r = c.post("/v1/files", files={"file": ("in.jsonl", io.BytesIO(b"{}"))}, headers=a)
    assert r.status_code == 429, r.text
    assert c.delete(f"/v1/files/{kept}", headers=a).status_code == 200  # room again
    assert _upload(c, "ka-0123456789abcdef", b"x" * 400).status_code == 200


async def test_usage_counts_uploads_and_outputs_and_forgets_expired_files() -> None:
    redis = fakeredis.FakeAsyncRedis()
    files = FileStore(redis, ttl_s=3600)
    await files.create("t", "in.jsonl", "batch", b"x" * 100)
    gone = await files.create("t", "old.jsonl", "batch", b"x" * 7)
    # A batch's output is written whatever the quota (the store checks none): it counts.
    out = files.writer(output_ids("batch_1")[0])
    await out.write(b"y" * 50)
    await out.close("t", "batch_1_output.jsonl", "batch_output")
    await files.create("u", "in.jsonl", "batch", b"z" * 1000)
    assert await files.usage("t") == (3, 157)
    await redis.delete(keys.file(gone.id))  # expired: its index entry lingers until read
    assert await files.usage("t") == (2, 150)
    assert await redis.zscore(keys.files("t"), gone.id) is None
    assert await files.usage("nobody") == (0, 0)
