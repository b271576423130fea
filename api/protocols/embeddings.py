"""The OpenAI embeddings API without HTTP: request, submission, refusal and answer, each an
`Answer` (status, body); the route (`inferq.api.routes.embeddings`) sends it, a batch line
(`inferq.api.batches.lines`) records it.

Request: `input` (a string or a list of strings; token arrays are refused), `model` (a
served model name; default INFERQ_MODEL), `encoding_format` ("float"; "base64": little-endian
float32 bytes, as OpenAI sends them; "int8", "uint8", "binary", "ubinary": `core.vectors`),
optional `user` (ignored), `dimensions` (one of the sizes a Matryoshka-trained model declares,
`ModelInfo.matryoshka_dims`: the vector is truncated and renormalised; for any other model it
must equal the width), and the inferq extension `wait` (seconds, default
INFERQ_SYNC_WAIT_S). It goes through the same pipeline as /v1/infer (`JobService.run`):
counted in the metrics, admitted, `Idempotency-Key` honoured, cancelled if the client leaves
before a worker starts it.

Errors use OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`:

| status | type | code | when |
|---|---|---|---|
| 400 | invalid_request_error | invalid_request | the body does not validate |
| 400 | invalid_request_error | invalid_request | `dimensions` the model cannot give (`param`) |
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

The endpoint is five functions, `parse_request` → `bind` → `submission` → (`refusal`) →
`answer`: a batch line goes through the same five, so its output is exactly what the route
would send. `bind` reads the model's declaration (cached by the catalog) only when
`dimensions` is set, and refuses a size the model does not declare before anything is queued;
for a model that declares none the width is known only once it has run, so `answer` checks.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from inferq.api.core.admission import ModelCatalog
from inferq.api.core.decode import (
    InvalidBody,
    Submission,
    json_object,
    json_values,
    number,
    optional_str,
)
from inferq.api.core.errors import job_failure, request_error
from inferq.api.protocols import Answer, vectors
from inferq.shared.errors import Overloaded, RequestError
from inferq.shared.jobs import Job, Status

_FORMATS = vectors.FORMATS
# The same names as `vectors.FORMATS`, spelled out for the schema (a unit test pins both).
Format = Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]


class EmbeddingsRequest(BaseModel):
    # extra ignored: OpenAI clients may send fields we do not use; strict as `core.decode`.
    model_config = ConfigDict(extra="ignore", strict=True)

    input: str | list[str] = Field(
        description="Text or texts to embed; token arrays are not supported."
    )
    model: str | None = Field(None, description="Served model name; default INFERQ_MODEL.")
    encoding_format: Format = Field(
        "float",
        description="float; base64 (little-endian float32); int8 / uint8 (per-vector scale: "
        "round(127·x/max|x|), uint8 = int8 + 128); binary / ubinary (sign bits packed 8 per "
        "value, first dimension in the high bit; binary = ubinary − 128). See docs/api.md.",
    )
    dimensions: int | None = Field(
        None,
        gt=0,
        description="One of the sizes a Matryoshka-trained model declares (truncated, then "
        "renormalised); for any other model it must equal the width.",
    )
    user: str | None = None
    wait: float | None = Field(
        None,
        ge=0,
        description="inferq: seconds to wait before answering 202 (default INFERQ_SYNC_WAIT_S).",
    )
    # The model's declared Matryoshka sizes, set by `bind` (never read from the body): () until
    # bound, and for a model that declares none.
    _matryoshka_dims: tuple[int, ...] = PrivateAttr(())

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input

    @property
    def matryoshka_dims(self) -> tuple[int, ...]:
        return self._matryoshka_dims

    def bound_to(self, matryoshka_dims: tuple[int, ...]) -> EmbeddingsRequest:
        """This request knowing its model's Matryoshka sizes (see `bind`)."""
        self._matryoshka_dims = matryoshka_dims
        return self


_FORMAT_MESSAGE = "Input should be " + ", ".join(repr(f) for f in _FORMATS[:-1])
_FORMAT_MESSAGE += f" or {_FORMATS[-1]!r}"


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | list[int] | str


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


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
        raise InvalidBody("encoding_format", _FORMAT_MESSAGE)
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


def _dimensions_refused(req: EmbeddingsRequest, why: str) -> Answer:
    message = f"dimensions={req.dimensions} is not supported: {why}"
    return openai_error_answer(
        400, message, "invalid_request_error", "invalid_request", param="dimensions"
    )


async def bind(req: EmbeddingsRequest, catalog: ModelCatalog) -> EmbeddingsRequest | Answer:
    """The request knowing its model's Matryoshka sizes, or the 400 for a `dimensions` that
    model does not declare; before anything is queued. Reads nothing without `dimensions`.

    A model not served here is left to `submission`'s refusal (the same 404 either way); one
    that no worker has declared yet binds no sizes, so `answer` takes only its full width."""
    if req.dimensions is None:
        return req
    try:
        name = catalog.resolve(req.model)
    except RequestError:
        return req
    info = await catalog.info(name)
    sizes = info.matryoshka_dims if info is not None else ()
    if sizes and req.dimensions not in sizes:
        shown = ", ".join(str(d) for d in sizes)
        return _dimensions_refused(req, f"{name} takes one of {shown}")
    return req.bound_to(sizes)


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
    outputs, width = job.outputs, job.outputs.shape[1]
    if req.dimensions is not None and req.dimensions != width:
        if req.dimensions > width:
            return _dimensions_refused(req, f"{job.model} returns {width}")
        if req.dimensions not in req.matryoshka_dims:
            why = f"{job.model} returns {width} and declares no Matryoshka sizes to cut it to"
            return _dimensions_refused(req, why)
        outputs = vectors.truncate(outputs, req.dimensions)
    tokens = sum(approx_tokens(t) for t in req.texts())
    data = [
        {"object": "embedding", "index": i, "embedding": row}
        for i, row in enumerate(vectors.encode(outputs, req.encoding_format))
    ]
    body = {
        "object": "list",
        "data": data,
        "model": job.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return Answer(200, body)


class Embeddings:
    """The OpenAI embeddings adapter (`protocols.Adapter`): the route, the hot path and batch
    lines all go through these."""

    parse = staticmethod(parse_request)
    bind = staticmethod(bind)
    submission = staticmethod(submission)
    refusal = staticmethod(refusal)
    answer = staticmethod(answer)
