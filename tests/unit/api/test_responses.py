"""`responses`: which `Accept` headers get msgpack, and what a msgpack record holds (packed
little-endian arrays beside the same fields as the JSON)."""

from __future__ import annotations

import msgpack
import numpy as np
import orjson
import pytest

from inferq.api.responses import FastJSON, Msgpack, record_response, wants_msgpack


@pytest.mark.parametrize(
    ("accept", "packed"),
    [
        (None, False),
        ("", False),
        ("*/*", False),
        ("application/json", False),
        ("text/html, application/xhtml+xml", False),
        ("application/msgpack", True),
        (b"application/msgpack", True),
        ("application/x-msgpack", True),
        ("Application/MsgPack", True),
        ("application/msgpack, application/json", True),  # the client's default
        ("application/json, application/msgpack", True),  # equal weights: the one named packs
        ("application/json;q=1, application/msgpack;q=0.5", False),
        ("application/msgpack;q=0.9, */*;q=0.1", True),
        ("application/msgpack;q=0", False),
        ("application/msgpack;q=oops", False),
        ("application/msgpack-ish", False),
    ],
)
def test_accept(accept: str | bytes | None, packed: bool) -> None:
    assert wants_msgpack(accept) is packed


def test_a_record_packs_arrays_little_endian_with_dtype_and_shape() -> None:
    outputs = np.arange(6, dtype=">f4").reshape(2, 3)  # big-endian in memory: sent little
    body = {"id": "j", "status": "succeeded", "outputs": outputs, "n": np.int64(3)}
    r = record_response(body, packed=True)
    assert isinstance(r, Msgpack) and r.media_type == "application/msgpack"
    got = msgpack.unpackb(r.body, raw=False)
    assert got["outputs"] == {
        "dtype": "float32",
        "shape": [2, 3],
        "data": np.arange(6, dtype="<f4").tobytes(),
    }
    assert {k: v for k, v in got.items() if k != "outputs"} == {
        "id": "j",
        "status": "succeeded",
        "n": 3,
    }


def test_json_unless_asked_and_errors_always_json() -> None:
    body = {"id": "j", "outputs": np.ones((1, 2), dtype=np.float32)}
    plain = record_response(body, 200)
    assert isinstance(plain, FastJSON) and orjson.loads(plain.body)["outputs"] == [[1.0, 1.0]]
    failed = record_response({"id": "j", "error": {"code": "x"}}, 422, packed=True)
    assert isinstance(failed, FastJSON) and failed.status_code == 422
    accepted = record_response({"id": "j"}, 202, {"Location": "/v1/jobs/j"}, packed=True)
    assert isinstance(accepted, Msgpack) and accepted.headers["location"] == "/v1/jobs/j"
