"""The API's one error table: every error a request can meet → HTTP status and error code.

No FastAPI here: the routes' exception handlers (`inferq.api.routes.errors`), the batch
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
| CodecError (a bad record)  | 500    | corrupt_record               |
| job `too_large`            | 413    | invalid_request_error        |
| job `invalid_input`        | 422    | invalid_request_error        |
| job `model_error`          | 422    | invalid_request_error        |
| job `poisoned`             | 422    | invalid_request_error        |
| job `cancelled`            | 409    | invalid_request_error        |
| job `expired`              | 429    | rate_limit_error             |
"""

from __future__ import annotations

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
