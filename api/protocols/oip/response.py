"""The Open Inference Protocol's answers without HTTP: a final job → the infer response (JSON,
or a JSON header then the outputs' binary data), and every refusal → the protocol's error
shape, `{"error": "<message>"}`, with the status from inferq's one error table
(`core.errors`), except that what inferq answers 422 (an input that can never run) is a 400
here, as Triton answers it.

| when | status |
|---|---|
| a model not served here, a version other than "1" | 404 |
| a malformed request or tensor, an input or parameter the model does not take | 400 |
| an `Idempotency-Key` reused with a different request | 422 |
| over a limit: the body, a tensor, the job's inputs, the JSON's values | 413 |
| no key or a wrong one / a key without the role | 401 / 403 |
| admission refused it (queue, bytes, deadline, the tenant's share) | 429 + Retry-After |
| the API's bodies in flight are at their budget (`protocols.oip.body.BodyBudget`) | 429 + Retry-After |
| not finished within the wait | 429 + Retry-After |
| Redis down, loading, read-only or full | 503 + Retry-After |
| the job failed: `too_large` 413, `invalid_input` / `model_error` / `poisoned` 400, `cancelled` 409, `expired` 429 | |
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import orjson

from inferq.api.core.errors import job_failure, request_error, retry_headers
from inferq.api.core.idempotency import KeyReused
from inferq.api.protocols.oip.metadata import VERSION, output_kind, output_name
from inferq.api.protocols.oip.request import OipRequest
from inferq.api.protocols.oip.tensors import BYTES, Values, to_binary, to_json
from inferq.shared.errors import CodecError, QueueUnavailable, RedisFull, RequestError
from inferq.shared.jobs import Job, Status
from inferq.shared.registry import ModelInfo
from inferq.shared.schema import OutputKind

JSON = "application/json"
BINARY = "application/octet-stream"
HEADER_LENGTH = "Inference-Header-Content-Length"


class Reply(NamedTuple):
    """What an OIP route answers, before HTTP (`headers` include the content type)."""

    status: int
    body: bytes
    headers: dict[str, str]


def json_reply(body: dict[str, Any], status: int = 200) -> Reply:
    return Reply(status, orjson.dumps(body), {"content-type": JSON})


#: The most of a refusal's message an answer (or a log line) quotes: messages quote a bounded
#: prefix of what they refuse already; this holds for any message, whoever wrote it.
MAX_MESSAGE_CHARS = 1024


def bounded(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`message`, cut at `limit` characters with a note of how many were left out."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}… ({len(message) - limit} more characters)"


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    body = orjson.dumps({"error": bounded(message)})
    return Reply(status, body, {"content-type": JSON} | (headers or {}))


def _status(inferq_status: int) -> int:
    return 400 if inferq_status == 422 else inferq_status


def refusal(exc: Exception) -> Reply | None:
    """The answer to an error a route met, or None for one this table does not know (a bug:
    the server's 500)."""
    if isinstance(exc, KeyReused):  # not the protocol's (it has no Idempotency-Key): 422
        return error(422, str(exc))
    if isinstance(exc, RequestError):
        return error(_status(request_error(exc)[0]), str(exc), retry_headers(exc))
    if isinstance(exc, QueueUnavailable):
        # Redis's own words name hosts and ports: they stay in the log. RedisFull's are ours.
        message = str(exc) if isinstance(exc, RedisFull) else "the queue is unreachable; retry"
        return error(503, message, retry_headers(exc))
    if isinstance(exc, CodecError):
        return error(500, "the job record could not be read")
    return None


def late(job: Job, wait_s: float, *, cancelled: bool = True) -> Reply:
    """A job not final within the request's wait: the protocol has no way to fetch it later.
    `cancelled`: whether it was cancelled if still queued (not a repeat's: not this one's)."""
    what = "cancelled if still queued" if cancelled else "left to the request that made it"
    return error(
        429,
        f"job {job.id} did not finish within {wait_s:g} s (the request's timeout, else "
        f"INFERQ_SYNC_WAIT_S, at most INFERQ_MAX_LONG_POLL_S); it was {what}",
        {"Retry-After": "1"},
    )


def infer_reply(req: OipRequest, job: Job, info: ModelInfo | None) -> Reply:
    """What the infer call answers for a final job: its output (200) or why it failed."""
    if job.status is not Status.SUCCEEDED or job.outputs is None:
        code = job.error.code if job.error else None
        message = job.error.message if job.error else f"job {job.id} ended {job.status}"
        return error(_status(job_failure(code)[0]), message)
    name = output_name(info)
    k = req.output(name).classification
    datatype, shape, values = output_tensor(job.outputs, output_kind(info), k)
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(shape)}
    header: dict[str, Any] = {"model_name": job.model, "model_version": VERSION}
    if req.id is not None:
        header["id"] = req.id
    header["outputs"] = [entry]
    if not req.binary(name):
        entry["data"] = to_json(values)
        body = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
        return Reply(200, body, {"content-type": JSON})
    raw = to_binary(values, datatype)
    entry["parameters"] = {"binary_data_size": len(raw)}
    head = orjson.dumps(header)
    headers = {"content-type": BINARY, HEADER_LENGTH: str(len(head))}
    return Reply(200, b"".join((head, raw)), headers)


def output_tensor(
    outputs: np.ndarray | list[Any], kind: str, k: int = 0
) -> tuple[str, tuple[int, ...], Values]:
    """(datatype, shape, values) of a job's outputs (`oip_metadata` says which is which);
    `k`: the output's `classification`."""
    if isinstance(outputs, np.ndarray):
        return ("FP32", outputs.shape, outputs) if not k else _top_values(outputs, k)
    if kind == OutputKind.LABELS:
        return _labels(outputs, k)
    if kind == OutputKind.TEXT and all(isinstance(o, str) for o in outputs):
        return BYTES, (len(outputs),), list(outputs)
    return BYTES, (len(outputs),), [orjson.dumps(o).decode() for o in outputs]


def _classification(label: dict[str, Any]) -> str:
    # Triton's classification string: value (printed as C's %f), index, label if any.
    head = f"{float(label.get('score', 0.0)):f}:{label.get('index', '')}"
    return f"{head}:{label['label']}" if label.get("label") is not None else head


def _labels(outputs: list[Any], k: int) -> tuple[str, tuple[int, ...], Values]:
    """Each input's labels as k classification strings, best first; a row with fewer labels
    than the widest is padded with empty strings (a tensor is rectangular)."""
    rows = [[_classification(c) for c in (row[:k] if k else row)] for row in outputs]
    width = max((len(r) for r in rows), default=0)
    values: list[Any] = [s for r in rows for s in r + [""] * (width - len(r))]
    return BYTES, (len(rows), width), values


def _top_values(outputs: np.ndarray, k: int) -> tuple[str, tuple[int, ...], Values]:
    """A vector output classified: each row's k largest values as `value:index`."""
    rows = outputs.reshape(len(outputs), -1)
    top = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    values: list[Any] = [f"{row[i]:f}:{i}" for row, idx in zip(rows, top, strict=True) for i in idx]
    return BYTES, (len(rows), top.shape[1]), values
