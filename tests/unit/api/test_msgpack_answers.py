"""`Accept: application/msgpack` on `GET /v1/jobs/{id}` (the hot path): the same record as
the JSON, arrays packed; JSON otherwise, and for every error (fakeredis)."""

from __future__ import annotations

import msgpack
import numpy as np
from fastapi.testclient import TestClient

from inferq.shared import keys
from inferq.shared.jobs import Job, Status, encode_final, encode_submit
from tests.unit.api.conftest import MakeApp

OUTPUTS = np.arange(8, dtype=np.float32).reshape(2, 4) / 3


def _finished(make_app: MakeApp) -> TestClient:
    app = make_app()
    job = Job(id="j1", model="echo", inputs=["a", "b"])
    fields = encode_submit(job) | encode_final(
        Status.SUCCEEDED, finished_ms=job.created_ms + 3, outputs=OUTPUTS, batch=(2, 0)
    )
    app.client.portal.call(lambda: app.redis.hset(keys.job("j1"), mapping=fields))  # type: ignore[union-attr]
    return app.client


def test_a_job_in_msgpack_is_the_json_record_with_packed_arrays(make_app: MakeApp) -> None:
    c = _finished(make_app)
    as_json = c.get("/v1/jobs/j1")
    r = c.get("/v1/jobs/j1", headers={"Accept": "application/msgpack, application/json"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/msgpack"
    got = msgpack.unpackb(r.content, raw=False)
    packed = got.pop("outputs")
    assert packed["dtype"] == "float32" and packed["shape"] == [2, 4]
    array = np.frombuffer(packed["data"], dtype="<f4").reshape(packed["shape"])
    np.testing.assert_array_equal(array, OUTPUTS)  # bit for bit, no text round trip
    expected = as_json.json()
    np.testing.assert_allclose(expected.pop("outputs"), OUTPUTS, rtol=1e-6)
    assert got == expected
    waited = c.get("/v1/jobs/j1", params={"wait": 1}, headers={"Accept": "application/msgpack"})
    assert msgpack.unpackb(waited.content)["status"] == "succeeded"


def test_json_for_other_accepts_and_for_errors(make_app: MakeApp) -> None:
    c = _finished(make_app)
    for accept in ("application/json", "text/html", "application/msgpack;q=0", "*/*"):
        r = c.get("/v1/jobs/j1", headers={"Accept": accept})
        assert r.headers["content-type"] == "application/json", accept
        assert r.json()["id"] == "j1"
    missing = c.get("/v1/jobs/nope", headers={"Accept": "application/msgpack"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_the_schema_documents_the_msgpack_answers(make_app: MakeApp) -> None:
    paths = make_app().client.get("/openapi.json").json()["paths"]
    for path, method in (("/v1/jobs/{job_id}", "get"), ("/v1/infer", "post")):
        content = paths[path][method]["responses"]["200"]["content"]
        assert set(content) == {"application/json", "application/msgpack"}, path
    params = {p["name"] for p in paths["/v1/jobs/{job_id}"]["get"]["parameters"]}
    assert "accept" in params
