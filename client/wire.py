"""What travels between the client and the API, without doing any I/O: the steps a flow asks
its driver for (`Call`, `Sleep`), the answer it gets back (`Reply`), request bodies, and the
decoding of job views and embeddings into `Job`s and arrays.

Bodies follow docs/api.md: an input item is a string (text), `{"image": <base64>}` or
`{"tensor": {"dtype", "shape", "data"}}`. Here bytes become an image and a numpy array a
tensor (little-endian bytes in base64, the compact form the API prefers to nested lists).
"""

from __future__ import annotations

import base64
import email.utils
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import numpy as np

from inferq.client import packed
from inferq.client.errors import APIError, InvalidResponse, error_class
from inferq.client.jobs import Job, JobError, JobStatus, Outputs, Timings, as_outputs

# One input: text, an encoded image's bytes, a tensor, or an item already in the API's shape.
Item = str | bytes | np.ndarray | Mapping[str, Any]
Priority = Literal["high", "normal", "low"]

# The tensor dtypes the API takes (docs/api.md, "JSON body").
TENSOR_DTYPES = frozenset(
    ("bool", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8")
)
# The part of an unreadable error body kept in the message: enough to recognise a proxy's page.
_TEXT_KEPT = 300
# What the client asks for by default: a job record in msgpack, its arrays as packed bytes
# (a vector is 4 bytes a number instead of ~20 as JSON text, and no float parsing); JSON from
# a server that does not speak it. `compact=False` asks for JSON only.
ACCEPT_COMPACT = "application/msgpack, application/json"
ACCEPT_JSON = "application/json"


@dataclass(frozen=True)
class Call:
    """One HTTP request a flow wants made. `wait_s`: how long the server may hold the answer
    on purpose (a long-poll), added to the read timeout so a long-poll never reads as a hang."""

    method: str
    path: str
    json: Any = None
    params: Mapping[str, str] | None = None
    idempotency_key: str | None = None
    wait_s: float = 0.0

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        base = http.timeout
        read = None if base.read is None else base.read + self.wait_s
        timeout = httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)
        headers = {"Idempotency-Key": self.idempotency_key} if self.idempotency_key else None
        return http.build_request(
            self.method,
            self.path,
            json=self.json,
            params=self.params,
            headers=headers,
            timeout=timeout,
        )


@dataclass(frozen=True)
class Sleep:
    """Pause before the next step (a retry's backoff)."""

    seconds: float


@dataclass(frozen=True)
class Reply:
    """An HTTP answer as the flows read it: status, headers, the body decoded (JSON, or
    msgpack when the server answered `application/msgpack`; None if it is neither) and the
    start of its text (for the message of an unreadable error)."""

    status: int
    headers: Mapping[str, str]
    body: Any
    text: str = ""

    @classmethod
    def of(cls, response: httpx.Response) -> Reply:
        if response.headers.get("content-type", "").startswith("application/msgpack"):
            try:
                return cls(response.status_code, response.headers, packed.unpackb(response.content))
            except ValueError as e:
                raise InvalidResponse(
                    response.status_code, "invalid_response", f"unreadable msgpack: {e}"
                ) from e
        try:
            body = response.json()
        except ValueError:  # an HTML page from a proxy, an empty body
            body = None
        return cls(response.status_code, response.headers, body, response.text[:_TEXT_KEPT])

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def retry_after_s(self) -> float | None:
        return parse_retry_after(self.headers.get("retry-after"))

    @property
    def is_job(self) -> bool:
        """The body is a job view (a submit's answer, or `/v1/infer`'s failed job)."""
        return (
            isinstance(self.body, dict)
            and isinstance(self.body.get("id"), str)
            and isinstance(self.body.get("status"), str)
        )

    @property
    def error_code(self) -> str | None:
        error = self.body.get("error") if isinstance(self.body, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        return code if isinstance(code, str) else None

    def error(self) -> APIError:
        """The exception for this error answer: inferq's `{"error": {"code", "message"}}` or
        OpenAI's (same two keys), else the status and the start of the text."""
        error = self.body.get("error") if isinstance(self.body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        code = self.error_code or f"http_{self.status}"
        text = message if isinstance(message, str) else (self.text or "no body").strip()
        return error_class(self.status)(self.status, code, text, retry_after_s=self.retry_after_s)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header: delay-seconds or an HTTP date (RFC 9110); None when
    absent or unreadable. Never negative."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def encode_item(item: Item) -> Any:
    """One input in the API's JSON shape (see the module docstring)."""
    if isinstance(item, str):
        return item
    if isinstance(item, bytes | bytearray | memoryview):
        return {"image": base64.b64encode(bytes(item)).decode("ascii")}
    if isinstance(item, np.ndarray):
        if item.dtype.name not in TENSOR_DTYPES:
            raise ValueError(
                f"tensor dtype {item.dtype.name!r} is not taken by the API; "
                f"use one of {sorted(TENSOR_DTYPES)}"
            )
        little = np.ascontiguousarray(item, dtype=item.dtype.newbyteorder("<"))
        data = base64.b64encode(little.tobytes()).decode("ascii")
        return {"tensor": {"dtype": item.dtype.name, "shape": list(item.shape), "data": data}}
    if isinstance(item, Mapping):
        return dict(item)
    raise TypeError(f"an input is a str, bytes, numpy array or mapping, not {type(item).__name__}")


def job_body(
    inputs: Sequence[Item] | None,
    input: Item | None,
    *,
    model: str | None,
    priority: Priority | None,
    timeout_s: float | None,
    parameters: Mapping[str, Any] | None,
    webhook: str | None,
    metadata: Mapping[str, str] | None = None,
    result_ttl_s: int | None = None,
) -> dict[str, Any]:
    """The JSON body of `POST /v1/jobs` and `/v1/infer` (fields left to the server's defaults
    are not sent). Exactly one of `inputs` (a list) or `input` (one item)."""
    if (inputs is None) == (input is None):
        raise TypeError("give exactly one of inputs (a list of items) or input= (one item)")
    if isinstance(inputs, str | bytes | np.ndarray | Mapping):
        raise TypeError("inputs is a list of items: for one item pass input=item or [item]")
    body: dict[str, Any] = (
        {"input": encode_item(input)}  # type: ignore[arg-type]  # not None: checked above
        if inputs is None
        else {"inputs": [encode_item(i) for i in inputs]}
    )
    optional = {"model": model, "priority": priority, "timeout_s": timeout_s}
    body.update({k: v for k, v in optional.items() if v is not None})
    if parameters:
        body["parameters"] = dict(parameters)
    if webhook is not None:
        body["webhook"] = {"url": webhook}
    if metadata:
        body["metadata"] = dict(metadata)
    if result_ttl_s is not None:
        body["result_ttl_s"] = result_ttl_s
    return body


def list_params(
    *,
    limit: int,
    after: str | None,
    status: str | None,
    model: str | None,
    metadata: Mapping[str, str] | None,
    created_after: int | None,
    created_before: int | None,
    include_outputs: bool,
) -> dict[str, str]:
    """The query of `GET /v1/jobs` (filters left out are not sent)."""
    params = {
        "limit": limit,
        "after": after,
        "status": status,
        "model": model,
        "created_after": created_after,
        "created_before": created_before,
    }
    query = {k: str(v) for k, v in params.items() if v is not None}
    query.update({f"metadata[{k}]": v for k, v in (metadata or {}).items()})
    if include_outputs:
        query["include_outputs"] = "true"
    return query


def embeddings_body(texts: str | Sequence[str], model: str | None, wait_s: float) -> dict[str, Any]:
    """`POST /v1/embeddings` asking for base64 (4 bytes a number instead of ~20 as text)."""
    body: dict[str, Any] = {
        "input": [texts] if isinstance(texts, str) else list(texts),
        "encoding_format": "base64",
        "wait": wait_s,
    }
    if model is not None:
        body["model"] = model
    return body


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _timings(raw: Any) -> Timings:
    raw = raw or {}
    return Timings(
        queued_ms=_optional_int(raw.get("queued_ms")),
        run_ms=_optional_int(raw.get("run_ms")),
        total_ms=_optional_int(raw.get("total_ms")),
        batch_size=_optional_int(raw.get("batch_size")),
        batch_tokens=_optional_int(raw.get("batch_tokens")),
        cached=bool(raw.get("cached", False)),
    )


def decode_job(reply: Reply) -> Job:
    """The `Job` in a job view (fields this client does not know are ignored)."""
    return _job(reply.body, reply.status)


def decode_job_list(reply: Reply) -> tuple[list[Job], bool, str | None]:
    """A page of `GET /v1/jobs`: its jobs, whether there are more, and the next `after`."""
    body = reply.body
    try:
        data, more, last = body["data"], bool(body["has_more"]), body.get("last_id")
    except (KeyError, TypeError) as e:
        raise InvalidResponse(reply.status, "invalid_response", f"not a job list: {e!r}") from e
    return [_job(view, reply.status) for view in data], more, last


def _job(body: Any, status: int) -> Job:
    try:
        error, outputs = body.get("error"), body.get("outputs")
        return Job(
            id=str(body["id"]),
            model=str(body.get("model", "")),
            status=JobStatus(body["status"]),
            outputs=None if outputs is None else _outputs(outputs),
            error=None if error is None else JobError(str(error["code"]), str(error["message"])),
            timings=_timings(body.get("timings")),
            worker=body.get("worker"),
            position=_optional_int(body.get("position")),
            eta_ms=_optional_int(body.get("eta_ms")),
            items_total=_optional_int(body.get("items_total")),
            items_done=_optional_int(body.get("items_done")),
            cancel_requested=bool(body.get("cancel_requested", False)),
            metadata=dict(body.get("metadata") or {}),
            created_at=_optional_int(body.get("created_at")),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise InvalidResponse(status, "invalid_response", f"not a job view: {e!r}") from e


def _outputs(outputs: Any) -> Outputs:
    # A msgpack answer packs a vector model's outputs as one array; JSON lists them.
    if packed.is_array(outputs):
        return packed.array(outputs).astype(np.float32, copy=False)
    return as_outputs(outputs)


def _row(embedding: Any) -> np.ndarray:
    if isinstance(embedding, str):  # base64 of little-endian float32
        return np.frombuffer(base64.b64decode(embedding, validate=True), dtype="<f4")
    return np.asarray(embedding, dtype=np.float32)


def decode_embeddings(reply: Reply) -> np.ndarray:
    """An OpenAI embeddings list as a float32 (n, dim) array, row i for input i."""
    try:
        data = sorted(reply.body["data"], key=lambda d: int(d["index"]))
        rows = [_row(d["embedding"]) for d in data]
        return np.stack(rows).astype(np.float32)
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidResponse(
            reply.status, "invalid_response", f"not an embeddings list: {e!r}"
        ) from e


def job_vectors(job: Job) -> np.ndarray:
    """A succeeded embeddings job's outputs as a float32 (n, dim) array."""
    if not isinstance(job.outputs, np.ndarray):
        raise InvalidResponse(200, "invalid_response", f"job {job.id}'s outputs are not vectors")
    return job.outputs


def http_options(
    base_url: str,
    api_key: str | None,
    timeout: float | httpx.Timeout,
    headers: Mapping[str, str] | None,
    compact: bool = True,
) -> dict[str, Any]:
    """The httpx settings both clients share: base URL, Bearer key, timeouts, and what to
    accept (`compact`: msgpack job records first, `ACCEPT_COMPACT`; else JSON only).

    A number as `timeout` bounds connect, read and write, not the wait for a pooled
    connection: `map` beyond the pool's size (100) then queues for a connection instead of
    failing with a pool timeout while long-polls hold the others."""
    merged = {"user-agent": "inferq-client", **(headers or {})}
    if all(k.lower() != "accept" for k in merged):  # the caller's own Accept wins
        merged["accept"] = ACCEPT_COMPACT if compact else ACCEPT_JSON
    if api_key:
        merged["authorization"] = f"Bearer {api_key}"
    if not isinstance(timeout, httpx.Timeout):
        timeout = httpx.Timeout(timeout, pool=None)
    return {"base_url": base_url, "headers": merged, "timeout": timeout}
