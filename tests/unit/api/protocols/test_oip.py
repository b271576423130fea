"""The OIP infer request (pure): the body split by its header length, the binary data
consumed input by input, the schedule policy, the limits checked before any data is decoded,
and the request as an inferq job (texts, images, tensor rows) checked against the model."""

from __future__ import annotations

import base64
import gzip
import zlib
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as triton

from inferq.api.core.decode import wire_inputs
from inferq.api.protocols.oip.body import inflate, split_body
from inferq.api.protocols.oip.request import (
    OipRequest,
    Output,
    check_version,
    parse_infer,
    submission,
)
from inferq.api.protocols.oip.tensors import pack_bytes
from inferq.shared.errors import InputInvalid, InputTooLarge, ModelNotServed
from inferq.shared.registry import ModelInfo
from inferq.shared.settings import Settings

SETTINGS = Settings(model="echo")
TEXT = ModelInfo(inputs=("text",), output="vector", parameters={})
IMAGE = ModelInfo(inputs=("image",), output="labels", parameters={"top_k": "how many"})
TENSOR = ModelInfo(inputs=("tensor",), output="any", parameters={"scale": "a factor"})
MANY = 8  # the protocol's parsing of several tensors (a route allows one: `MAX_TENSORS`)


def _tensor(name: str, datatype: str, shape: list[int], **rest: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, **rest}


def _json(*inputs: dict[str, Any], settings: Settings = SETTINGS, **doc: Any) -> OipRequest:
    return parse_infer(orjson.dumps({"inputs": list(inputs), **doc}), None, settings, MANY)


def _binary(inputs: list[dict[str, Any]], data: bytes, **doc: Any) -> OipRequest:
    header = orjson.dumps({"inputs": inputs, **doc})
    return parse_infer(header + data, str(len(header)), SETTINGS, MANY)


def test_the_body_splits_at_the_header_length() -> None:
    header, binary = split_body(b'{"a":1}xyz', "7")
    assert header == b'{"a":1}' and bytes(binary) == b"xyz"
    header, binary = split_body(b'{"a":1}', None)
    assert header == b'{"a":1}' and len(binary) == 0
    for bad in ("11", "-1", "seven", ""):
        with pytest.raises(InputInvalid, match="Inference-Header-Content-Length"):
            split_body(b'{"a":1}xyz', bad)


def test_what_tritonclient_sends_parses_binary_and_json() -> None:
    texts = np.array(["hello", "wörld"], dtype=object)
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    for binary in (True, False):
        a = triton.InferInput("text", [2], "BYTES").set_data_from_numpy(texts, binary)
        b = triton.InferInput("tensor", [2, 3], "FP32").set_data_from_numpy(rows, binary)
        body, length = triton.InferenceServerClient.generate_request_body(
            [a, b], request_id="r1", priority=1, timeout=2_500_000, parameters={"scale": 2}
        )
        req = parse_infer(body, None if length is None else str(length), SETTINGS, MANY)
        assert req.id == "r1" and req.priority == "high" and req.timeout_s == 2.5
        assert req.parameters == {"scale": 2} and req.outputs is None
        assert req.binary_output is True  # the client asks for binary outputs by default
        got = req.inputs[0].values
        assert [v if isinstance(v, str) else str(v, "utf-8") for v in got] == list(texts)
        np.testing.assert_array_equal(req.inputs[1].values, rows)


def test_binary_data_is_consumed_input_by_input() -> None:
    ints = np.array([1, 2, 3], dtype="<i8").tobytes()
    strings = pack_bytes([b"x", b"yz"])
    req = _binary(
        [
            _tensor("a", "INT64", [3], parameters={"binary_data_size": 24}),
            _tensor("b", "FP32", [1], data=[0.5]),  # JSON between binary inputs
            _tensor("c", "BYTES", [2], parameters={"binary_data_size": len(strings)}),
        ],
        ints + strings,
    )
    assert req.inputs[0].values.tolist() == [1, 2, 3]
    assert req.inputs[1].values.tolist() == [0.5]
    assert [bytes(v) for v in req.inputs[2].values] == [b"x", b"yz"]


MALFORMED_BINARY = [
    ([_tensor("a", "FP32", [2], parameters={"binary_data_size": 8})], b"\0" * 12,
     "add up to 8 bytes, but 12 bytes follow the JSON header: 4 left over"),
    ([_tensor("a", "FP32", [2], parameters={"binary_data_size": 8}),
      _tensor("b", "FP32", [2], parameters={"binary_data_size": 8})], b"\0" * 12,
     "input 'b': binary_data_size 8 starts at byte 8 of the binary data, which has 12"),
    ([_tensor("a", "FP32", [3], parameters={"binary_data_size": 8})], b"\0" * 8,
     r"input 'a': binary_data_size is 8 bytes; FP32 × \[3\] needs 12"),
    ([_tensor("t", "BYTES", [2], parameters={"binary_data_size": 9})], pack_bytes([b"a"]) + b"\5\0\0\0",
     "input 't': BYTES element 1 of 2 is truncated: it declares 5 bytes, 0 remain"),
    ([_tensor("t", "BYTES", [1], parameters={"binary_data_size": 2})], b"\1\0",
     "input 't': BYTES element 0 of 1 is truncated: its 4-byte length"),
    ([_tensor("a", "FP32", [1], data=[1.0], parameters={"binary_data_size": 4})], b"\0" * 4,
     "input 'a' has both data and parameters.binary_data_size"),
    ([_tensor("a", "FP32", [1], parameters={"binary_data_size": -4})], b"",
     "input 'a': binary_data_size must be a non-negative integer"),
    ([_tensor("a", "FP32", [1])], b"", "input 'a' has neither data nor"),
    ([_tensor("a", "FP32", [1], parameters={"shared_memory_region": "r"})], b"",
     "input 'a': shared memory is not supported"),
]  # fmt: skip


@pytest.mark.parametrize(("inputs", "data", "why"), MALFORMED_BINARY)
def test_malformed_binary_is_refused_naming_the_input(
    inputs: list[dict[str, Any]], data: bytes, why: str
) -> None:
    with pytest.raises(InputInvalid, match=why):
        _binary(inputs, data)


MALFORMED = [
    (b"[1]", "must be a JSON object"),
    (b"{", "JSON does not parse"),
    (b'{"inputs": []}', "inputs must be a non-empty list"),
    (b'{"inputs": [{"datatype": "FP32"}]}', "string 'name'"),
    (b'{"id": 3, "inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}]}',
     "id must be a string"),
    (b'{"inputs": [{"name": "a", "datatype": "FP8", "shape": [1], "data": [1]}]}',
     "input 'a': datatype 'FP8'"),
    (b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [-1], "data": [1]}]}',
     "input 'a': shape"),
    (b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "data": [1]}]}',
     r"input 'a': data flat \(1 values\) does not match shape \[2\]"),
    (b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1], '
     b'"parameters": []}]}', "input 'a' parameters must be a JSON object"),
    (b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}], '
     b'"outputs": [{"name": "o", "parameters": {"binary_data": 1}}]}', "output 'o'"),
    (b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}], '
     b'"outputs": {}}', "outputs must be a list"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "why"), MALFORMED)
def test_malformed_requests_are_refused(doc: bytes, why: str) -> None:
    with pytest.raises(InputInvalid, match=why):
        parse_infer(doc, None, SETTINGS)


ONE = _tensor("text", "BYTES", [1], data=["x"])


@pytest.mark.parametrize(
    ("priority", "lane"), [(0, "normal"), (1, "high"), (2, "normal"), (3, "low"), (99, "low")]
)
def test_priority_maps_to_a_lane(priority: int, lane: str) -> None:
    assert _json(ONE, parameters={"priority": priority}).priority == lane
    assert _json(ONE).priority == "normal"


def test_the_schedule_policy_and_the_models_parameters() -> None:
    req = _json(ONE, parameters={"timeout": 1_500, "binary_data_output": True, "top_k": 3})
    assert req.timeout_s == 0.0015 and req.binary_output and req.parameters == {"top_k": 3}
    assert _json(ONE, parameters={"timeout": 0}).timeout_s is None  # the default deadline
    for params, why in (
        ({"priority": -1}, "'priority' must be a non-negative integer"),
        ({"priority": True}, "'priority' must be a non-negative integer"),
        ({"timeout": 1.5}, "'timeout' must be a non-negative integer"),
        ({"timeout": 86_400 * 10**6 + 1}, "over a day"),
        ({"binary_data_output": "yes"}, "'binary_data_output' must be a boolean"),
        ({"sequence_id": 7}, "'sequence_id' is not supported"),
        ({"triton_enable_empty_final_response": True}, "is not supported"),
    ):
        with pytest.raises(InputInvalid, match=why):
            _json(ONE, parameters=params)


def test_requested_outputs() -> None:
    req = _json(ONE, outputs=[{"name": "labels", "parameters": {"classification": 2}}])
    assert req.outputs == [Output("labels", None, 2)]
    assert req.output("labels").classification == 2 and req.output("other") == Output("other")
    wants = [{"name": "v", "parameters": {"binary_data": False}}]
    req = _json(ONE, outputs=wants, parameters={"binary_data_output": True})
    assert req.binary("v") is False and req.binary("w") is True


def test_limits_hold_before_any_data_is_decoded() -> None:
    small = Settings(model="echo", max_inputs_per_job=4, max_tensor_bytes=64, max_json_values=50)
    # No data at all: the shape alone is over the limit, so nothing is read.
    with pytest.raises(InputTooLarge, match=r"input 'text': 5 job inputs .*MAX_INPUTS_PER_JOB=4"):
        _json(_tensor("text", "BYTES", [5, 1]), settings=small)
    with pytest.raises(InputTooLarge, match=r"a row of FP32 \[17\] is 68 bytes, over .*=64"):
        _json(_tensor("tensor", "FP32", [1, 17]), settings=small)
    with pytest.raises(InputTooLarge, match="MAX_INPUTS_PER_JOB=4"):
        _json(_tensor("tensor", "FP32", [1_000_000, 1]), settings=small)
    with pytest.raises(InputTooLarge, match="INFERQ_MAX_JSON_VALUES=50"):
        _json(_tensor("tensor", "FP32", [1, 16], data=[0.0] * 60), settings=small)
    assert len(_json(_tensor("tensor", "FP32", [4, 16], data=[0.0] * 64)).inputs[0]) == 4


def test_compressed_bodies_inflate_within_the_body_limit() -> None:
    body = b'{"inputs": []}' * 10
    assert inflate(gzip.compress(body), "gzip", 1000) == body
    assert inflate(zlib.compress(body), " Deflate", 1000) == body
    with pytest.raises(InputTooLarge, match="inflates past INFERQ_MAX_BODY_BYTES=100"):
        inflate(gzip.compress(b"\0" * 10_000), "gzip", 100)
    with pytest.raises(InputInvalid, match="truncated gzip"):
        inflate(gzip.compress(body)[:-12], "gzip", 1000)
    with pytest.raises(InputInvalid, match="does not inflate"):
        inflate(b"not gzip", "gzip", 1000)
    with pytest.raises(InputInvalid, match="Content-Encoding 'br'"):
        inflate(body, "br", 1000)


def test_one_version_per_model() -> None:
    check_version("echo", None)
    check_version("echo", "1")
    check_version("echo", "")
    with pytest.raises(ModelNotServed, match="no version '2'"):
        check_version("echo", "2")


# --- the request as a job ---
def _sub(req: OipRequest, info: ModelInfo | None, model: str = "m") -> Any:
    return submission(req, model, info, "acme", "key-1")


def _text_request(elements: list[bytes]) -> OipRequest:
    raw = pack_bytes(elements)
    spec = _tensor("text", "BYTES", [len(elements), 1], parameters={"binary_data_size": len(raw)})
    return _binary([spec], raw)


def test_texts_become_text_items() -> None:
    req = _text_request([b"hello", "ü".encode()])
    req.priority, req.timeout_s, req.parameters = "low", 2.0, {"x": 1}
    sub = _sub(req, TEXT)
    assert sub.items == ["hello", "ü"] and sub.files == []
    assert (sub.model, sub.tenant, sub.idempotency_key) == ("m", "acme", "key-1")
    assert (sub.priority, sub.timeout_s, sub.parameters) == ("low", 2.0, {"x": 1})
    with pytest.raises(InputInvalid, match="input 'text': element 1 is not UTF-8"):
        _sub(_text_request([b"ok", b"\xff"]), TEXT)


def test_images_become_uploaded_files_from_binary_or_base64() -> None:
    jpeg = b"\xff\xd8\xff\xe0 a jpeg"
    raw = pack_bytes([jpeg])
    req = _binary([_tensor("image", "BYTES", [1], parameters={"binary_data_size": len(raw)})], raw)
    assert _sub(req, IMAGE).files == [jpeg] and _sub(req, IMAGE).items == []
    req = _json(_tensor("image", "BYTES", [1], data=[base64.b64encode(jpeg).decode()]))
    assert _sub(req, IMAGE).files == [jpeg]
    with pytest.raises(InputInvalid, match="input 'image': element 0 is not base64"):
        _sub(_json(_tensor("image", "BYTES", [1], data=["not base64!"])), IMAGE)


def test_classification_asks_a_labeling_model_for_its_top_k() -> None:
    jpeg = base64.b64encode(b"\xff\xd8\xff").decode()
    one = _tensor("image", "BYTES", [1], data=[jpeg])
    wants = [{"name": "labels", "parameters": {"classification": 3}}]
    assert _sub(_json(one, outputs=wants), IMAGE).parameters == {"top_k": 3}
    req = _json(one, outputs=wants, parameters={"top_k": 5})  # the request's own wins
    assert _sub(req, IMAGE).parameters == {"top_k": 5}
    assert _sub(_json(one), IMAGE).parameters == {}


def test_tensor_rows_become_tensor_inputs_copied_once() -> None:
    rows = np.arange(6, dtype="<i4").reshape(2, 3)
    raw = rows.tobytes()
    req = _binary([_tensor("tensor", "INT32", [2, 3], parameters={"binary_data_size": 24})], raw)
    sub = _sub(req, TENSOR)
    assert len(sub.items) == 2
    values, kinds = wire_inputs(sub.items, SETTINGS)  # what goes into Redis
    assert kinds == ["tensor", "tensor"]
    assert values[1] == {"tensor": {"dtype": "int32", "shape": [3], "data": rows[1].tobytes()}}
    with pytest.raises(InputInvalid, match="inferq tensors are not UINT16"):
        _sub(_json(_tensor("tensor", "UINT16", [1, 1], data=[1])), TENSOR)
    with pytest.raises(InputInvalid, match="needs a batch dimension"):
        _sub(_json(_tensor("tensor", "FP32", [], data=[1.0])), TENSOR)


def test_the_request_is_checked_against_the_model() -> None:
    text = _tensor("text", "BYTES", [1], data=["x"])
    with pytest.raises(InputInvalid, match=r"model 'm' has no input 'image'; it takes: text"):
        _sub(_json(_tensor("image", "BYTES", [1], data=["eA=="])), TEXT)
    with pytest.raises(InputInvalid, match="one input tensor per request, not 2"):
        _sub(_json(text, _tensor("text2", "BYTES", [1], data=["y"])), TEXT)
    with pytest.raises(InputInvalid, match="input 'text' must be BYTES"):
        _sub(_json(_tensor("text", "FP32", [1], data=[1.0])), TEXT)
    with pytest.raises(InputInvalid, match="model 'm' has no output 'logits'; it gives: vector"):
        _sub(_json(text, outputs=[{"name": "logits"}]), TEXT)
    # No worker has declared the model yet: every input name goes, the worker checks.
    assert _sub(_json(text), None).items == ["x"]
