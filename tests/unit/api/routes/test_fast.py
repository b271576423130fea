"""The hot path's table (`routes.fast.HotTable`), read off the app's documented routes: it
holds each hot endpoint's documented (method, path), and what it takes (and does not:
multipart bodies, longer paths, other methods) is what those routes would otherwise serve."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from inferq.api.app import create_app
from inferq.api.routes import jobs
from inferq.api.routes.fast import HOT, HotTable
from inferq.shared.settings import Settings


def _scope(method: str, path: str, ctype: bytes = b"application/json") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "headers": [(b"content-type", ctype)]}


def _table() -> HotTable:
    app = create_app(Settings(_env_file=None))
    assert app.hot is not None
    return app.hot.table


def test_the_table_is_the_documented_routes_of_the_hot_endpoints() -> None:
    app = create_app(Settings(_env_file=None))
    documented = app.openapi()["paths"]
    table = _table()
    pairs = set(table.exact) | {(m, head + "/{job_id}") for m, head in table.prefixed}
    assert pairs == {
        ("GET", "/v1/jobs/{job_id}"),
        ("POST", "/v1/jobs"),
        ("POST", "/v1/infer"),
        ("POST", "/v1/embeddings"),
    }
    for method, path in pairs:
        assert method.lower() in documented[path], (method, path)
    # Every hot endpoint is mounted: a route renamed away would drop off the hot path here.
    assert set(table.exact.values()) | set(table.prefixed.values()) == set(HOT.values())


def test_a_route_moved_moves_its_hot_path_with_it() -> None:
    router = APIRouter()
    router.add_api_route("/v2/infer-now", jobs.infer, methods=["POST"])
    table = HotTable.of(router.routes)
    assert table.handler(_scope("POST", "/v2/infer-now")) is HOT[jobs.infer]
    assert table.handler(_scope("POST", "/v1/infer")) is None


def test_the_table_takes_json_bodies_and_one_segment_job_reads_only() -> None:
    table = _table()
    assert table.handler(_scope("GET", "/v1/jobs/abc.0.x")) is HOT[jobs.get_job]
    assert table.handler(_scope("POST", "/v1/infer")) is HOT[jobs.infer]
    assert table.handler(_scope("POST", "/v1/jobs")) is HOT[jobs.submit_job]
    assert table.handler(_scope("POST", "/v1/infer", b"multipart/form-data; boundary=x")) is None
    assert table.handler(_scope("GET", "/v1/jobs/a/b")) is None
    assert table.handler(_scope("GET", "/v1/jobs/")) is None  # no id: FastAPI answers
    assert table.handler(_scope("GET", "/v1/jobs")) is None  # the listing is not hot
    assert table.handler(_scope("DELETE", "/v1/jobs/a")) is None
    assert table.handler(_scope("POST", "/v1/batches")) is None
