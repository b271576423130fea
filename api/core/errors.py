"""The API's one error table: every error a request can meet → HTTP status and error code.

No FastAPI here: the app's exception handlers (`inferq.api.handlers`), the batch
lines and the metrics all read these tables. Two tables, both here and nowhere else:

- `REQUEST_ERRORS`: a refused request (`inferq.shared.errors.RequestError`) → (status, code).
- `JOB_FAILURES`: a job that ended without success, by its `error.code` → (status, OpenAI
  error type), for the routes that wait for the result (`/v1/infer`, `/v1/embeddings`). A
  failed job is about its input or the load, never a server fault the client could not have
  caused: 4xx, so nothing a client sends turns into a 5xx.

| error                      | status | code / type                  |
|----------------------------|--------|------------------------------|
| Unauthorized               | 401    | unauthorized                 |
| Forbidden                  | 403    | forbidden                    |
| JobNotFound                | 404    | not_found                    |
| ModelNotServed             | 404    | model_not_found              |
| JobConflict                | 409    | conflict                     |
| InputTooLarge              | 413    | input_rejected               |
| InputInvalid, bad JSON     | 422    | invalid_input / invalid_request |
| Overloaded                 | 429    | overloaded + Retry-After     |
| QueueUnavailable           | 503    | unavailable + Retry-After    |
| Redis OOM under the guard  | 503    | unavailable, as RedisFull    |
| CodecError (a bad record)  | 500    | corrupt_record               |
| job `too_large`            | 413    | invalid_request_error        |
| job `invalid_input`        | 422    | invalid_request_error        |
| job `model_error`          | 422    | invalid_request_error        |
| job `poisoned`             | 422    | invalid_request_error        |
| job `cancelled`            | 409    | invalid_request_error        |
| job `expired`              | 429    | rate_limit_error             |
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import MasterDownError, OutOfMemoryError, ReadOnlyError

from inferq.shared.errors import (
    Forbidden,
    InputInvalid,
    InputTooLarge,
    JobConflict,
    JobNotFound,
    ModelNotServed,
    Overloaded,
    QueueUnavailable,
    RequestError,
    Unauthorized,
)
from inferq.shared.schema import ErrorCode

REQUEST_ERRORS: dict[type[RequestError], tuple[int, str]] = {
    Unauthorized: (401, "unauthorized"),
    Forbidden: (403, "forbidden"),
    JobNotFound: (404, "not_found"),
    ModelNotServed: (404, "model_not_found"),
    JobConflict: (409, "conflict"),
    InputTooLarge: (413, "input_rejected"),
    InputInvalid: (422, "invalid_input"),
    Overloaded: (429, "overloaded"),
}

# 429 for an expired job: the deadline passed while it waited behind others, so the load is
# the cause and retrying later can succeed (408 would blame the client's slowness).
JOB_FAILURES: dict[str, tuple[int, str]] = {
    ErrorCode.TOO_LARGE: (413, "invalid_request_error"),
    ErrorCode.INVALID_INPUT: (422, "invalid_request_error"),
    ErrorCode.MODEL_ERROR: (422, "invalid_request_error"),
    ErrorCode.POISONED: (422, "invalid_request_error"),
    ErrorCode.CANCELLED: (409, "invalid_request_error"),
    ErrorCode.EXPIRED: (429, "rate_limit_error"),
}


def request_error(exc: RequestError) -> tuple[int, str]:
    """(HTTP status, error code) of a refused request; 400 for one not in the table."""
    for cls in type(exc).__mro__:
        if cls in REQUEST_ERRORS:
            return REQUEST_ERRORS[cls]  # type: ignore[index]
    return 400, "bad_request"


def refusal_reason(exc: RequestError) -> str:
    """A refused submit's metric label: the admission reason of a 429 (`queue_full`,
    `deadline`...), else the error code. From a fixed set: never the client's words."""
    return exc.reason if isinstance(exc, Overloaded) else request_error(exc)[1]


# Redis refusals by error code (the word redis-py's message starts with), in our words: what
# `/readyz` reports after one (`inferq.api.core.admission`). Redis's own text names hosts.
WRITE_REFUSALS = {
    "OOM": "out of memory (maxmemory, noeviction)",
    "MISCONF": "writes stopped after a failed RDB save",
    "NOREPLICAS": "too few replicas for min-replicas-to-write",
    "READONLY": "a read-only replica",
    "MASTERDOWN": "its master is down",
}


# The ones redis-py types, stripping the code from the message.
_TYPED: tuple[tuple[type[Exception], str], ...] = (
    (OutOfMemoryError, "OOM"),
    (ReadOnlyError, "READONLY"),
    (MasterDownError, "MASTERDOWN"),
)


def _causes(exc: BaseException) -> list[str]:
    """The messages of `exc` and its causes, each typed refusal's with its code put back."""
    out: list[str] = []
    e: BaseException | None = exc
    while e is not None and len(out) < 8:
        code = next((c for t, c in _TYPED if isinstance(e, t)), None)
        out.append(f"{code} {e}" if code else str(e).removeprefix("redis unavailable: "))
        e = e.__cause__
    return out


def write_refusal(exc: BaseException) -> str | None:
    """What kind of write refusal from Redis `exc` (or its cause) is, or None for another
    failure (a timeout, a lost connection). Inside a script, Redis 6 says "... -OOM ..."."""
    for msg in _causes(exc):
        for code, why in WRITE_REFUSALS.items():
            if msg.startswith(code + " ") or f"-{code} " in msg or f": {code} " in msg:
                return why
    return None


def out_of_memory(exc: BaseException) -> bool:
    """A write Redis refused because it is at maxmemory: the memory guard's 503, not
    "unreachable" (`inferq.api.core.admission.Reservation`)."""
    return write_refusal(exc) == WRITE_REFUSALS["OOM"]


def job_failure(code: str | None) -> tuple[int, str]:
    """(HTTP status, OpenAI error type) of a job that ended with `error.code` = code."""
    return JOB_FAILURES.get(code or "", (422, "invalid_request_error"))


def retry_headers(exc: Exception) -> dict[str, str]:
    if isinstance(exc, Overloaded | QueueUnavailable):
        return {"Retry-After": str(exc.retry_after_s)}
    if isinstance(exc, Unauthorized):
        return {"WWW-Authenticate": "Bearer"}
    return {}


def _loc(loc: tuple[object, ...]) -> str:
    return ".".join(str(p) for p in loc if p != "body") or "body"


def validation_message(errors: list[dict[str, object]]) -> tuple[str, list[dict[str, str]]]:
    """A pydantic validation failure as (one message, [{loc, msg}]). Messages and locations
    only: the offending value may be bytes that are not UTF-8, or a client's megabytes."""
    detail = [
        {"loc": _loc(tuple(e.get("loc", ()))), "msg": str(e.get("msg", ""))}  # type: ignore[arg-type]
        for e in errors
    ]
    return "; ".join(f"{d['loc']}: {d['msg']}" for d in detail) or "invalid request", detail


def error_body(code: str, message: str) -> dict[str, Any]:
    """The body of every error answer (`{"error": {"code", "message"}}`)."""
    return {"error": {"code": code, "message": message}}
