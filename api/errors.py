"""One table from error type to HTTP answer; nothing a client sends becomes a 5xx."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferq.api.limits import BodyLimit, BodyTooLarge
from inferq.api.responses import FastJSON, error_body
from inferq.shared.errors import (
    CodecError,
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

log = logging.getLogger("inferq.api")


def _loc(loc: tuple[object, ...]) -> str:
    return ".".join(str(p) for p in loc if p != "body") or "body"


async def _validation(request: Request, exc: RequestValidationError) -> FastJSON:
    # Echo messages and locations only: the offending value may be bytes that are not UTF-8.
    detail = [
        {"loc": _loc(tuple(e.get("loc", ()))), "msg": str(e.get("msg", ""))} for e in exc.errors()
    ]
    message = "; ".join(f"{d['loc']}: {d['msg']}" for d in detail) or "invalid request"
    body = error_body("invalid_request", message) | {"detail": detail}
    return FastJSON(body, status_code=422)


#: Each client-caused error's HTTP status and `error.code`; the OpenAI routes reuse it.
REQUEST_ERRORS: dict[type[RequestError], tuple[int, str]] = {
    Unauthorized: (401, "unauthorized"),
    JobNotFound: (404, "not_found"),
    ModelNotServed: (404, "model_not_found"),
    JobConflict: (409, "conflict"),
    InputTooLarge: (413, "input_rejected"),
    InputInvalid: (422, "input_rejected"),
    Overloaded: (429, "overloaded"),
}


def request_error(exc: RequestError) -> tuple[int, str]:
    """(HTTP status, error code) of a client-caused error; 400 for one not in the table."""
    for cls in type(exc).__mro__:
        if cls in REQUEST_ERRORS:
            return REQUEST_ERRORS[cls]  # type: ignore[index]
    return 400, "bad_request"


async def _request_error(request: Request, exc: RequestError) -> FastJSON:
    status, code = request_error(exc)
    log.info("rejected %s %s: %s %s", request.method, request.url.path, code, exc)
    headers: dict[str, str] = {}
    if isinstance(exc, Overloaded):
        headers["Retry-After"] = str(exc.retry_after_s)
    elif isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return FastJSON(error_body(code, str(exc)), status_code=status, headers=headers)


async def _unavailable(request: Request, exc: Exception) -> FastJSON:
    retry = exc.retry_after_s if isinstance(exc, QueueUnavailable) else 1
    log.warning("redis unavailable on %s %s: %s", request.method, request.url.path, exc)
    return FastJSON(
        error_body("unavailable", "the queue is unreachable; retry shortly"),
        status_code=503,
        headers={"Retry-After": str(retry)},
    )


async def _codec(request: Request, exc: CodecError) -> FastJSON:
    log.error("undecodable record on %s: %s", request.url.path, exc)
    return FastJSON(
        error_body("corrupt_record", "the job record could not be read"), status_code=500
    )


async def _http(request: Request, exc: StarletteHTTPException) -> FastJSON:
    if isinstance(exc.__cause__, BodyTooLarge):  # a chunked body that outgrew the limit
        return BodyLimit.reject(request.app.state.settings.max_body_bytes)
    return FastJSON(
        error_body("http_error", str(exc.detail)), status_code=exc.status_code, headers=exc.headers
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]
    app.add_exception_handler(RequestError, _request_error)  # type: ignore[arg-type]
    app.add_exception_handler(QueueUnavailable, _unavailable)
    app.add_exception_handler(RedisConnectionError, _unavailable)
    app.add_exception_handler(RedisTimeoutError, _unavailable)
    # e.g. OOM under noeviction, or READONLY during a failover: the queue cannot take work now.
    app.add_exception_handler(RedisError, _unavailable)
    app.add_exception_handler(CodecError, _codec)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
