"""Bounds a request meets before any work is spent on it (issue 28, items 5, 6 and 9): the
batch route authenticates before it reads its body and reads a bounded one; /v2 counts its
inputs before decoding any, bounds every shape, and quotes only a prefix of what it refuses."""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
import pytest

from inferq.api.core.decode import MAX_CONTROL_JSON_BYTES
from inferq.api.protocols.oip import request as oip
from inferq.api.protocols.oip.request import parse_infer
from inferq.api.protocols.oip.response import MAX_MESSAGE_CHARS, bounded
from inferq.api.routes import batches
from inferq.shared.errors import InputInvalid
from inferq.shared.settings import Settings
from tests.unit.api.conftest import MakeApp

KEY = "ka-0123456789abcdef"


def _spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Count the calls of `module.name` (still calling it)."""
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_an_unauthenticated_batch_is_refused_before_its_body_is_read(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = make_app(api_keys=f"alpha:{KEY}").client
    read = _spy(monkeypatch, batches, "_limited_body")
    parsed = _spy(monkeypatch, batches, "json_budget")
    meta = orjson.dumps({f"k{i}": "v" for i in range(2_000_000)})  # ~30 MB of JSON values
    body = b'{"input_file_id": "f", "endpoint": "/v1/infer", "completion_window": "24h", '
    body += b'"metadata": ' + meta + b"}"
    assert len(body) > 25_000_000
    t0 = time.perf_counter()
    r = c.post("/v1/batches", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 401, r.text
    assert read == [] and parsed == []  # neither read nor parsed: refused on its header
    assert time.perf_counter() - t0 < 1.0
    # With the key, the same body is over the JSON budget: 413, before any parse.
    auth = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    r = c.post("/v1/batches", content=body, headers=auth)
    assert r.status_code == 413 and f"{MAX_CONTROL_JSON_BYTES} bytes" in r.text, r.text
    assert parsed == []
    # Within it: parsed, validated as before (the file does not exist).
    small = {"input_file_id": "file-nope", "endpoint": "/v1/infer", "completion_window": "24h"}
    r = c.post("/v1/batches", json=small, headers=auth)
    assert r.status_code == 404 and parsed == [1], r.text
    r = c.post("/v1/batches", json={"endpoint": "/v1/infer"}, headers=auth)
    assert r.status_code == 422 and "input_file_id" in r.text
    paths = make_app().client.get("/openapi.json").json()["paths"]  # an open API shows it
    assert "input_file_id" in str(paths["/v1/batches"]["post"]["requestBody"])  # documented


def _zero_inputs(n: int) -> bytes:
    names = (f"input-{i:06d}-" + "n" * 40 for i in range(n))
    inputs = [{"name": name, "datatype": "FP32", "shape": [0], "data": []} for name in names]
    return orjson.dumps({"inputs": inputs})


def test_inputs_are_counted_before_any_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded = _spy(monkeypatch, oip, "from_json")
    settings = Settings(model="echo", max_json_values=2_000_000)
    with pytest.raises(InputInvalid) as e:
        parse_infer(_zero_inputs(150_000), None, settings)
    assert decoded == []
    message = str(e.value)
    assert "150000 inputs" in message and "and 149997 more" in message and len(message) < 400
    outputs = [{"name": f"o{i}"} for i in range(50_000)]
    doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}
    with pytest.raises(InputInvalid, match="names 50000: 'o0', 'o1', 'o2' and 49997 more"):
        parse_infer(orjson.dumps(doc | {"outputs": outputs}), None, settings)


def test_a_refusal_of_150k_inputs_is_small_in_the_response_and_the_log(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    c = make_app(max_json_values=2_000_000).client
    with caplog.at_level(logging.INFO, logger="inferq.api"):
        r = c.post("/v2/models/echo/infer", content=_zero_inputs(150_000))
    assert r.status_code == 400 and len(r.content) < 1000, len(r.content)
    assert "150000 inputs" in r.json()["error"]
    lines = [rec.getMessage() for rec in caplog.records if "150000" in rec.getMessage()]
    assert lines and all(len(line) < 2 * MAX_MESSAGE_CHARS for line in lines)


def test_any_long_message_is_bounded() -> None:
    assert bounded("short") == "short"
    long = bounded("x" * 10_000)
    assert len(long) < MAX_MESSAGE_CHARS + 64 and long.endswith("(8976 more characters)")


@pytest.mark.parametrize("shape", [[1, 0, 2**63], [1, 0, 2**40], [2**25, 2]])
def test_every_dimension_is_bounded_at_parse_time(make_app: MakeApp, shape: list[int]) -> None:
    """A zero makes a tensor empty, but the other dimensions still count: `[1, 0, 2**63]` was
    a 500 and a closed connection (numpy's reshape), `[1, 0, 2**40]` was accepted."""
    c = make_app().client
    doc = {"inputs": [{"name": "tensor", "datatype": "FP32", "shape": shape, "data": []}]}
    r = c.post("/v2/models/echo/infer", content=orjson.dumps(doc))
    assert r.status_code == 400, r.text
    assert "spans more than" in r.json()["error"] and "INFERQ_MAX_BODY_BYTES" not in r.text
    # Binary data too: the shape is refused before its bytes are looked at.
    doc["inputs"][0] |= {"parameters": {"binary_data_size": 0}}
    del doc["inputs"][0]["data"]
    header = orjson.dumps(doc)
    r = c.post(
        "/v2/models/echo/infer",
        content=header,
        headers={"inference-header-content-length": str(len(header))},
    )
    assert r.status_code == 400 and "spans more than" in r.json()["error"], r.text
