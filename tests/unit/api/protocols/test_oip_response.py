"""The OIP answers (pure): a job's outputs as the official client reads them, JSON and binary;
labels as classification strings; metadata from what a model declares; every refusal and
failed job in the protocol's error shape with its status."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as triton

from inferq.api.protocols.oip.metadata import model_metadata, server_metadata
from inferq.api.protocols.oip.request import OipRequest, Output
from inferq.api.protocols.oip.response import Reply, infer_reply, late, output_tensor, refusal
from inferq.shared.errors import (
    CodecError,
    InputInvalid,
    InputTooLarge,
    JobConflict,
    ModelNotServed,
    Overloaded,
    QueueUnavailable,
    RedisFull,
    Unauthorized,
)
from inferq.shared.jobs import ErrorCode, Job, JobError, Status
from inferq.shared.registry import ModelInfo

VECTOR = ModelInfo(inputs=("text",), output="vector", parameters={})
LABELS = ModelInfo(inputs=("image",), output="labels", parameters={"top_k": "how many"})
TEXT = ModelInfo(inputs=("text",), output="text", parameters={"max_new_tokens": "n"})
BOXES = ModelInfo(inputs=("image",), output="boxes", parameters={})
CAT = [
    {"label": "tabby", "index": 281, "score": 0.5},
    {"label": "tiger cat", "index": 282, "score": 0.25},
    {"label": "Egyptian cat", "index": 285, "score": 0.125},
]


def _job(outputs: Any, status: Status = Status.SUCCEEDED, error: JobError | None = None) -> Job:
    return Job(id="j1", model="m", inputs=[], status=status, outputs=outputs, error=error)


def _request(outputs: list[Output] | None = None, binary: bool = False) -> OipRequest:
    return OipRequest(id="r-7", inputs=[], outputs=outputs, binary_output=binary)


def _read(reply: Reply) -> triton.InferResult:
    """The reply as tritonclient reads a response body."""
    length = reply.headers.get("Inference-Header-Content-Length")
    return triton.InferenceServerClient.parse_response_body(
        reply.body, header_length=None if length is None else int(length)
    )


def test_vectors_in_json_and_in_binary_read_by_the_client() -> None:
    vectors = np.arange(8, dtype=np.float32).reshape(2, 4) / 3
    for binary in (False, True):
        reply = infer_reply(_request(binary=binary), _job(vectors), VECTOR)
        assert reply.status == 200
        assert reply.headers["content-type"] == (
            "application/octet-stream" if binary else "application/json"
        )
        result = _read(reply)
        np.testing.assert_array_equal(result.as_numpy("vector"), vectors)
        response = result.get_response()
        assert response["id"] == "r-7" and response["model_name"] == "m"
        assert response["model_version"] == "1"
        assert response["outputs"][0]["shape"] == [2, 4]
    # A requested output's own binary_data wins over the request's binary_data_output.
    reply = infer_reply(
        _request([Output("vector", binary=False)], binary=True), _job(vectors), VECTOR
    )
    assert "Inference-Header-Content-Length" not in reply.headers
    assert "id" not in orjson.loads(
        infer_reply(OipRequest(None, [], None), _job(vectors), VECTOR).body
    )


def test_labels_are_classification_strings() -> None:
    rows = [CAT, CAT[:1]]  # a shorter row is padded: a tensor is rectangular
    for binary in (False, True):
        reply = infer_reply(_request(binary=binary), _job(rows), LABELS)
        labels = _read(reply).as_numpy("labels")
        assert labels.shape == (2, 3)
        assert [v.decode() if isinstance(v, bytes) else v for v in labels[0]] == [
            "0.500000:281:tabby",
            "0.250000:282:tiger cat",
            "0.125000:285:Egyptian cat",
        ]
        assert [v.decode() if isinstance(v, bytes) else v for v in labels[1]][1:] == ["", ""]
    reply = infer_reply(_request([Output("labels", classification=2)]), _job([CAT]), LABELS)
    assert _read(reply).as_numpy("labels").shape == (1, 2)


def test_a_vector_classified_gives_its_largest_values() -> None:
    datatype, shape, values = output_tensor(np.array([[0.1, 0.7, 0.2]], np.float32), "vector", 2)
    assert (datatype, shape) == ("BYTES", (1, 2))
    assert values == ["0.700000:1", "0.200000:2"]


def test_texts_and_json_documents() -> None:
    assert output_tensor(["a", "b"], "text") == ("BYTES", (2,), ["a", "b"])
    boxes = [[{"box": [0.0, 1.0, 2.0, 3.0], "label": "x", "score": 1.0}], []]
    datatype, shape, values = output_tensor(boxes, "boxes")
    assert (datatype, shape) == ("BYTES", (2,))
    assert [orjson.loads(v) for v in values] == boxes  # type: ignore[union-attr]
    reply = infer_reply(_request(binary=True), _job(["hi", "there"]), TEXT)
    assert _read(reply).as_numpy("text_output").tolist() == [b"hi", b"there"]


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ErrorCode.INVALID_INPUT, 400),
        (ErrorCode.MODEL_ERROR, 400),
        (ErrorCode.POISONED, 400),
        (ErrorCode.TOO_LARGE, 413),
        (ErrorCode.CANCELLED, 409),
        (ErrorCode.EXPIRED, 429),
    ],
)
def test_a_failed_job_answers_its_status_in_the_protocols_shape(code: str, status: int) -> None:
    job = _job(None, Status.FAILED, JobError(code, "input 0: not a decodable image"))
    reply = infer_reply(_request(), job, LABELS)
    assert reply.status == status
    assert orjson.loads(reply.body) == {"error": "input 0: not a decodable image"}


@pytest.mark.parametrize(
    ("exc", "status", "headers"),
    [
        (ModelNotServed("model 'x' is not served here"), 404, {}),
        (InputInvalid("input 'a': shape"), 400, {}),
        (InputTooLarge("over INFERQ_MAX_TENSOR_BYTES"), 413, {}),
        (JobConflict("already ended"), 409, {}),
        (Unauthorized("missing key"), 401, {"WWW-Authenticate": "Bearer"}),
        (Overloaded("INFERQ_MAX_QUEUE=1", retry_after_s=3), 429, {"Retry-After": "3"}),
        (QueueUnavailable("redis at 10.0.0.1:6379 refused"), 503, {"Retry-After": "1"}),
        (RedisFull("redis is over its high-water mark"), 503, {"Retry-After": "1"}),
        (CodecError("bad record"), 500, {}),
    ],
)
def test_refusals_take_the_protocols_error_shape(
    exc: Exception, status: int, headers: dict[str, str]
) -> None:
    reply = refusal(exc)
    assert reply is not None and reply.status == status
    assert reply.headers == {"content-type": "application/json"} | headers
    message = orjson.loads(reply.body)["error"]
    assert isinstance(message, str)
    if isinstance(exc, QueueUnavailable) and not isinstance(exc, RedisFull):
        assert "10.0.0.1" not in message  # Redis's own words stay in the log
    elif not isinstance(exc, CodecError):
        assert message == str(exc)


def test_an_unknown_error_is_not_answered_here() -> None:
    assert refusal(RuntimeError("a bug")) is None


def test_a_late_job_answers_429() -> None:
    reply = late(_job(None, Status.QUEUED), 0.25)
    assert reply.status == 429 and reply.headers["Retry-After"] == "1"
    assert "did not finish within 0.25 s" in orjson.loads(reply.body)["error"]


def test_metadata_from_what_the_model_declares() -> None:
    assert server_metadata("0.1.0") == {
        "name": "inferq",
        "version": "0.1.0",
        "extensions": ["binary_tensor_data", "classification", "schedule_policy", "parameters"],
    }
    meta = model_metadata("efficientnet-lite0", LABELS)
    assert meta == {
        "name": "efficientnet-lite0",
        "versions": ["1"],
        "platform": "inferq",
        "inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "labels", "datatype": "BYTES", "shape": [-1, -1]}],
        "parameters": {"top_k": "how many"},
    }
    both = ModelInfo(inputs=("text", "tensor"), output="weird", parameters={})
    meta = model_metadata("m", both)
    assert [i["name"] for i in meta["inputs"]] == ["text", "tensor"]
    assert meta["inputs"][1] == {"name": "tensor", "datatype": "FP32", "shape": [-1, -1]}
    assert meta["outputs"] == [{"name": "output", "datatype": "BYTES", "shape": [-1]}]
    assert model_metadata("m", VECTOR)["outputs"][0]["datatype"] == "FP32"
    assert model_metadata("m", BOXES)["outputs"][0]["name"] == "boxes"
