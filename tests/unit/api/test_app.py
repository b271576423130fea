"""API behaviour that needs no Lua: validation, reads, readiness — on fakeredis."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import fakeredis
import pytest
from fastapi.testclient import TestClient

from inferq.shared import keys
from inferq.shared.jobs import Job, Status, encode_final, encode_submit
from tests.unit.api.conftest import MakeApp


@pytest.fixture
def client(make_app: MakeApp) -> tuple[TestClient, fakeredis.FakeAsyncRedis]:
    app = make_app(max_inputs_per_job=2, max_input_chars=5, max_body_bytes=200)
    return app.client, app.redis


def test_get_reads_a_finished_job(client) -> None:  # type: ignore[no-untyped-def]
    c, fake = client
    import numpy as np

    job = Job(id="j1", model="echo", inputs=["a", "b"])
    fields = encode_submit(job) | encode_final(
        Status.SUCCEEDED,
        finished_ms=job.created_ms + 3,
        outputs=np.ones((2, 4), np.float32),
        batch=(2, 2),
    )
    c.portal.call(lambda: fake.hset(keys.job("j1"), mapping=fields))  # type: ignore[attr-defined]
    r = c.get("/v1/jobs/j1")
    assert r.status_code == 200
    body = r.json()
    assert body["outputs"] == [[1.0] * 4, [1.0] * 4]
    assert body["timings"]["total_ms"] == 3 and body["status"] == "succeeded"
    assert (
        c.get("/v1/jobs/j1", params={"wait": 5}).json()["status"] == "succeeded"
    )  # final: no wait


def test_validation_and_limits(client) -> None:  # type: ignore[no-untyped-def]
    c, _ = client
    assert c.post("/v1/jobs", json={"inputs": ["a", "b", "c"]}).status_code == 413
    r = c.post("/v1/jobs", json={"input": "toolong"})
    assert r.status_code == 413 and "INFERQ_MAX_INPUT_CHARS=5" in r.json()["error"]["message"]
    r = c.post(
        "/v1/jobs",
        content=b'{"input": "' + b"x" * 300 + b'"}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and "INFERQ_MAX_BODY_BYTES" in r.json()["error"]["message"]
    assert c.post("/v1/jobs", json={"input": "a", "model": "other"}).status_code == 404
    assert c.post("/v1/jobs", json={"input": 3}).status_code == 422
    assert c.post("/v1/jobs", json={"input": "a", "extra": 1}).status_code == 422
    assert c.get("/v1/jobs/nope").status_code == 404
    assert c.get("/v1/jobs/nope", params={"wait": -1}).status_code == 422


def test_readyz_without_workers_is_503(client) -> None:  # type: ignore[no-untyped-def]
    c, _ = client
    r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["unserved_models"] == ["echo"]
    assert c.get("/healthz").json() == {"status": "ok"}
    assert "/v1/jobs" in c.get("/openapi.json").json()["paths"]


def test_refused_model_names_never_become_metric_labels(make_app: MakeApp) -> None:
    """A client's model string is not a label value: 100 refusals with unique 100 KB names
    leave /metrics small, with none of them in it, and no error echoes one whole."""
    c = make_app().client
    names = [f"m{i}-" + secrets.token_hex(50_000) for i in range(100)]
    for name in names:
        r = c.post("/v1/jobs", json={"input": "x", "model": name})
        assert r.status_code == 404 and len(r.text) < 1_000
    text = c.get("/metrics").text
    assert len(text) < 1_000_000
    assert not any(name[:40] in text for name in names)
    assert 'inferq_jobs_rejected_total{model="unknown",reason="model_not_found"} 100.0' in text


def test_a_json_body_past_the_value_budget_is_refused_before_parsing(make_app: MakeApp) -> None:
    c = make_app(max_json_values=1000).client
    data = [[0.5] * 50] * 50  # 2,500 values as nested lists
    tensor = {"tensor": {"dtype": "float32", "shape": [50, 50], "data": data}}
    r = c.post("/v1/jobs", json={"input": tensor})
    assert r.status_code == 413 and "INFERQ_MAX_JSON_VALUES=1000" in r.json()["error"]["message"]
    r = c.post("/v1/embeddings", json={"input": ["a, b"] * 600})
    assert r.status_code == 413 and r.json()["error"]["code"] == "input_rejected"


def test_the_hot_routes_refuse_a_body_past_the_limit_declared_or_chunked(
    make_app: MakeApp,
) -> None:
    """The hot path applies INFERQ_MAX_BODY_BYTES as it reads: a declared length past it is
    refused unread, a chunked body (no length) once it passes it; a chunked body within it is
    read whole (and refused for its unknown model, not its size)."""
    app = make_app(max_body_bytes=100)
    c = app.client
    big = b'{"input": "' + b"x" * 200 + b'"}'
    json = {"content-type": "application/json"}

    def chunks(body: bytes) -> Iterator[bytes]:
        for i in range(0, len(body), 30):
            yield body[i : i + 30]

    for path in ("/v1/jobs", "/v1/infer", "/v1/embeddings"):
        for content in (big, chunks(big)):
            r = c.post(path, content=content, headers=json)
            assert r.status_code == 413, (path, r.text)
            assert r.json()["error"]["code"] == "body_too_large", r.text
            assert "INFERQ_MAX_BODY_BYTES=100" in r.json()["error"]["message"]
    fits = b'{"input": "' + b"x" * 70 + b'", "model": "nope"}'
    assert len(fits) <= 100
    r = c.post("/v1/jobs", content=chunks(fits), headers=json)
    assert r.status_code not in (413, 500), r.text  # read whole: the model is what it refuses


def test_an_oversized_body_is_refused_in_each_protocols_shape(make_app: MakeApp) -> None:
    c = make_app(max_body_bytes=100).client
    big = b'{"input": "' + b"x" * 200 + b'"}'
    r = c.post("/v1/jobs", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    r = c.post("/v2/models/echo/infer", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "INFERQ_MAX_BODY_BYTES" in r.json()["error"]
