"""The client's compact transfer: it asks for msgpack by default (JSON with `compact=False`),
reads a msgpack answer with its own decoder (`client.packed`, checked against the msgpack
package the server uses), and returns the very `Job` a JSON answer gives."""

from __future__ import annotations

import math
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest

from inferq.api.responses import record_response
from inferq.client import InvalidResponse
from inferq.client import packed as unpack
from tests.unit.client.fakes import FakeAPI, FakeClock, async_client, client, job, reply

VECTORS = np.array([[2.0, 11.0, 4854149.0, 1.0], [3.0, 5.0, 3018192.0, 1.0]], dtype=np.float32)


def packed_reply(status: int, body: dict[str, Any], **headers: str) -> httpx.Response:
    """What the API sends for `Accept: application/msgpack` (its own encoder)."""
    r = record_response(body, status, headers or None, packed=True)
    return httpx.Response(status, content=r.body, headers=dict(r.headers))


@pytest.mark.parametrize(
    "value",
    [
        None, True, False, 0, 127, 128, 255, 256, 65_535, 65_536, 2**32, 2**64 - 1, -1, -32,
        -33, -128, -129, -32_768, -32_769, -(2**31) - 1, -(2**63), 1.5, -0.0, math.inf, "",
        "a" * 31, "a" * 32, "é" * 300, "x" * 70_000, b"", b"\0" * 300, b"\1" * 70_000, [],
        [1] * 15, [1] * 16, [1] * 70_000, {}, {str(i): i for i in range(16)},
        {"k": [{"a": [1, 2, {"b": None}]}]},
    ],
)  # fmt: skip
def test_the_decoder_reads_what_msgpack_writes(value: Any) -> None:
    assert unpack.unpackb(msgpack.packb(value, use_bin_type=True)) == value


def test_single_floats_and_bad_bytes() -> None:
    assert unpack.unpackb(msgpack.packb(1.25, use_single_float=True)) == 1.25
    for bad in (b"", b"\xc4\x05ab", b"\x92\x01", b"\x01\x02", b"\xd4\x01\x00", b"\xa2\xff\xfe"):
        with pytest.raises(ValueError):
            unpack.unpackb(bad)
    deep = b"\x91" * (unpack.MAX_DEPTH + 2) + b"\x00"
    with pytest.raises(ValueError, match="nested"):
        unpack.unpackb(deep)


def test_asks_for_msgpack_by_default_and_json_when_told() -> None:
    api = FakeAPI([reply(200, job()), reply(200, job())])
    with client(api, FakeClock()) as c:
        c.get("j1")
    with client(api, FakeClock(), compact=False) as c:
        c.get("j1")
    assert [s.headers["accept"] for s in api.seen] == [
        "application/msgpack, application/json",
        "application/json",
    ]
    mine = FakeAPI([reply(200, job())])
    with client(mine, FakeClock(), headers={"Accept": "text/plain"}) as c:
        c.get("j1")
    assert mine.seen[0].headers.get_list("accept") == ["text/plain"]  # the caller's own wins


@pytest.mark.parametrize(
    "outputs",
    [
        VECTORS,
        [[{"label": "tabby", "index": 281, "score": 0.27}]],
        ["text", "more"],
        [[1.0, 2.0], [3.0, 4.0]],  # vectors as a list (an "any" model's): an array, as in JSON
    ],
)
def test_a_msgpack_job_decodes_to_the_same_job_as_json(outputs: Any) -> None:
    fields = {"outputs": outputs, "timings": {"run_ms": 3}, "items_total": 2, "items_done": 2}
    listed = outputs.tolist() if isinstance(outputs, np.ndarray) else outputs
    api = FakeAPI(
        [packed_reply(200, job(**fields)), reply(200, job(**fields | {"outputs": listed}))]
    )
    with client(api, FakeClock()) as c:
        compact, plain = c.get("j1"), c.get("j1")
    assert compact.to_dict() == plain.to_dict()
    if isinstance(plain.outputs, np.ndarray):
        assert isinstance(compact.outputs, np.ndarray) and compact.outputs.dtype == np.float32
        np.testing.assert_array_equal(compact.outputs, plain.outputs)
        compact.outputs[0, 0] = 0  # writable, like the JSON one


async def test_infer_long_polls_in_msgpack_too() -> None:
    accepted = packed_reply(
        202, {"id": "j1", "status": "queued", "model": "echo"}, Location="/v1/jobs/j1"
    )
    api = FakeAPI([accepted, packed_reply(200, job(outputs=VECTORS))])
    async with async_client(api, FakeClock()) as c:
        got = await c.infer(["hello world", "a b c"])
    assert api.requests() == [("POST", "/v1/infer"), ("GET", "/v1/jobs/j1")]
    np.testing.assert_array_equal(got.outputs, VECTORS)  # type: ignore[arg-type]


def test_unreadable_msgpack_is_an_invalid_response() -> None:
    bad = httpx.Response(200, content=b"\xc1", headers={"content-type": "application/msgpack"})
    with client(FakeAPI([bad]), FakeClock()) as c, pytest.raises(InvalidResponse):
        c.get("j1")
    wrong = {"dtype": "float32", "shape": [3, 4], "data": b"\0" * 8}  # 2 floats for 12
    api = FakeAPI([packed_reply(200, job(outputs=wrong))])
    with client(api, FakeClock()) as c, pytest.raises(InvalidResponse, match="not a job view"):
        c.get("j1")
