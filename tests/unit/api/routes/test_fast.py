"""The hot path's table (`routes.fast.HOT`) against the documented routes: every hot
(method, path) is a route of the app's OpenAPI document, and what the table takes (and does
not: multipart bodies, longer paths) is what the routes would otherwise serve."""

from __future__ import annotations

from typing import Any

from inferq.api.app import create_app
from inferq.api.routes.fast import HOT, JOB_PREFIX, hot_handler
from inferq.shared.settings import Settings


def _scope(method: str, path: str, ctype: bytes = b"application/json") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "headers": [(b"content-type", ctype)]}


def test_every_hot_route_is_a_documented_route() -> None:
    documented = create_app(Settings(_env_file=None)).openapi()["paths"]
    for method, path in HOT:
        doc_path = path.replace("{id}", "{job_id}")
        assert doc_path in documented, path
        assert method.lower() in documented[doc_path], (method, path)


def test_the_table_takes_json_bodies_and_one_segment_job_reads_only() -> None:
    for method, path in HOT:
        concrete = path.replace("{id}", "abc.0.x")
        assert hot_handler(_scope(method, concrete)) is HOT[(method, path)]
    assert hot_handler(_scope("POST", "/v1/infer", b"multipart/form-data; boundary=x")) is None
    assert hot_handler(_scope("GET", JOB_PREFIX + "a/b")) is None
    assert hot_handler(_scope("GET", "/v1/jobs")) is None  # the listing is not hot
    assert hot_handler(_scope("DELETE", JOB_PREFIX + "a")) is None
    assert hot_handler(_scope("POST", "/v1/batches")) is None
