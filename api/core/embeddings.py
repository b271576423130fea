"""The OpenAI embeddings API without HTTP: request, submission, refusal and answer, each an
`Answer` (status, body); the route (`inferq.api.routes.embeddings`) sends it, a batch line
(`inferq.api.batches.lines`) records it.

Request: `input` (a string or a list of strings; token arrays are refused), `model` (a
served model name; default INFERQ_MODEL), `encoding_format` ("float" or "base64":
little-endian float32 bytes, as OpenAI sends them), optional `user` (ignored),
`dimensions` (accepted only if equal to the model's width: nothing here can shorten a
vector), and the inferq extension `wait` (seconds, default INFERQ_SYNC_WAIT_S). It goes
through the same pipeline as /v1/infer (`JobService.run`): counted in the metrics, admitted,
`Idempotency-Key` honoured, cancelled if the client leaves before a worker starts it.

Errors use OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`:

| status | type | code | when |
|---|---|---|---|
| 400 | invalid_request_error | invalid_request | the body does not validate |
| 404 | invalid_request_error | model_not_found | a model not served here |
| 413 / 422 | invalid_request_error | input_rejected / invalid_input | too many / too long / empty inputs |
| 413 | invalid_request_error | too_large | an input too large for the device even alone |
| 422 | invalid_request_error | model_error / poisoned / invalid_input | the model failed on an input |
| 429 | rate_limit_error | expired / overloaded | the deadline passed, or the queue is full |
| 202 | – | – | not done within `wait`: `{id, status}` and a `Location` naming the job |

A 202 carries `x-should-retry: false` so a client never resubmits the same texts while the
first job is still queued (an OpenAI client raises on it: give it a `wait` that fits). The
job still finishes; `GET /v1/jobs/{id}` (the `Location`) returns its vectors. Redis errors keep inferq's
shape (503 + Retry-After, from the app's handlers), whose `error.message` clients read too.

The endpoint is four functions, `parse_request` → `submission` → (`refusal`) → `answer`: a
batch line goes through the same four, so its output is exactly what the route would send.
"""

from __future__ import annotations

import base64
from typing import Any, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from inferq.api.core.decode import InvalidBody, json_object, number, optional_str
from inferq.api.core.errors import job_failure, request_error
from inferq.api.core.inputs import json_values
from inferq.api.core.service import Submission
from inferq.shared.errors import Overloaded, RequestError
from inferq.shared.jobs import Job, Status

_FORMATS = ("float", "base64")


class EmbeddingsRequest(BaseModel):
    # extra ignored: OpenAI clients may send fields we do not use; strict as `core.decode`.
    model_config = ConfigDict(extra="ignore", strict=True)

    input: str | list[str] = Field(
        description="Text or texts to embed; token arrays are not supported."
    )
    model: str | None = Field(None, description="Served model name; default INFERQ_MODEL.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, gt=0, description="Must equal the model's width.")
    user: str | None = None
    wait: float | None = Field(
        None,
        ge=0,
        description="inferq: seconds to wait before answering 202 (default INFERQ_SYNC_WAIT_S).",
    )

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class Answer(NamedTuple):
    """What the endpoint answers, before HTTP: the route sends it, a batch line records it."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] | None = None


def openai_error_answer(
    status: int,
    message: str,
    type_: str,
    code: str,
    *,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return Answer(status, body, headers)


def approx_tokens(text: str) -> int:
    """Whitespace words, at least 1.

    An approximation: the API never loads a tokenizer (no tokenizers/torch here), and the
    job record does not carry per-item token counts yet. Wordpiece tokens are typically
    ~1.3× the word count for English; the worker knows the exact costs and could store them.
    """
    return max(1, len(text.split()))


def _encode(row: np.ndarray, fmt: str) -> np.ndarray | str:
    if fmt == "base64":
        return base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode("ascii")
    return row  # orjson writes numpy rows natively


def embeddings_body(raw: bytes) -> EmbeddingsRequest:
    """A `/v1/embeddings` body as `EmbeddingsRequest` would take it (extra fields ignored),
    built without validation once these checks pass; `InvalidBody` otherwise."""
    body = json_object(raw)
    if "input" not in body:
        raise InvalidBody("input", "Field required")
    text = body["input"]
    if not isinstance(text, str) and not (
        isinstance(text, list) and all(isinstance(t, str) for t in text)
    ):
        raise InvalidBody("input", "Input should be a string or a list of strings")
    fmt = body.get("encoding_format", "float")
    if fmt not in _FORMATS or not isinstance(fmt, str):
        raise InvalidBody("encoding_format", "Input should be 'float' or 'base64'")
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions <= 0
    ):
        raise InvalidBody("dimensions", "Input should be an integer greater than 0")
    wait = body.get("wait")
    return EmbeddingsRequest.model_construct(
        input=text,
        model=optional_str(body.get("model"), "model"),
        encoding_format=fmt,
        dimensions=dimensions,
        user=optional_str(body.get("user"), "user"),
        wait=None if wait is None else number(wait, "wait", ge=0),
    )


def parse_request(raw: bytes, max_values: int | None = None) -> EmbeddingsRequest | Answer:
    """The request in a JSON body, or the 400 (413 past `max_values`, before parsing: see
    `inputs.check_json_budget`) the endpoint answers for it."""
    if max_values is not None and (n := json_values(raw)) > max_values:
        message = f"the JSON body holds about {n} values, over INFERQ_MAX_JSON_VALUES={max_values}"
        return openai_error_answer(413, message, "invalid_request_error", "input_rejected")
    try:
        req = embeddings_body(raw)
    except InvalidBody as e:
        param = e.detail[0]["loc"]
        return openai_error_answer(
            400, str(e), "invalid_request_error", "invalid_request", param=param
        )
    if not req.texts():
        return openai_error_answer(
            400, "'input' is empty", "invalid_request_error", "invalid_request", param="input"
        )
    return req


def submission(req: EmbeddingsRequest, tenant: str, **fields: Any) -> Submission:
    """The job a request asks for (`fields`: priority, idempotency_key, timeout_s...)."""
    return Submission(items=list(req.texts()), model=req.model, tenant=tenant, **fields)


def refusal(e: RequestError) -> Answer:
    """What the endpoint answers when the submission is refused."""
    if isinstance(e, Overloaded):
        return openai_error_answer(
            429, str(e), "rate_limit_error", e.reason, headers={"Retry-After": str(e.retry_after_s)}
        )
    status, code = request_error(e)
    return openai_error_answer(status, str(e), "invalid_request_error", code)


def _failed(job: Job) -> Answer:
    code = job.error.code if job.error else "model_error"
    message = job.error.message if job.error else f"job {job.id} {job.status}"
    status, type_ = job_failure(code)
    return openai_error_answer(status, message, type_, code)


def answer(req: EmbeddingsRequest, job: Job) -> Answer:
    """What the endpoint answers for a final job: the vectors (200) or OpenAI's error shape."""
    if job.status != Status.SUCCEEDED or not isinstance(job.outputs, np.ndarray):
        return _failed(job)
    outputs = job.outputs
    if req.dimensions is not None and req.dimensions != outputs.shape[1]:
        return openai_error_answer(
            400,
            f"dimensions={req.dimensions} is not supported: {job.model} returns {outputs.shape[1]}",
            "invalid_request_error",
            "invalid_request",
            param="dimensions",
        )
    tokens = sum(approx_tokens(t) for t in req.texts())
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(row, req.encoding_format)}
        for i, row in enumerate(outputs)
    ]
    body = {
        "object": "list",
        "data": data,
        "model": job.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return Answer(200, body)
