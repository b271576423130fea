"""API behaviour that needs no Lua: validation, reads, readiness — on fakeredis."""

from __future__ import annotations

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
        batch_size=2,
        batch_tokens=2,
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
