"""The exception handlers: every error a route lets through → its status and body, from
the one table (`inferq.api.core.errors`)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferq.api.core.decode import InvalidBody
from inferq.api.core.errors import error_body, request_error, retry_headers, validation_message
from inferq.api.middleware import BodyLimit, BodyTooLarge
from inferq.api.parts import parts_of
from inferq.api.responses import FastJSON
from inferq.shared.errors import CodecError, QueueUnavailable, RedisFull, RequestError

log = logging.getLogger("inferq.api")


def validation_response(detail_errors: list[dict[str, object]]) -> FastJSON:
    message, detail = validation_message(detail_errors)
    return FastJSON(error_body("invalid_request", message) | {"detail": detail}, status_code=422)


def error_response(exc: Exception, method: str, path: str) -> FastJSON | None:
    """The answer to an error a route let through, or None for one this table does not know
    (a bug: the server's 500). The FastAPI handlers and the hot routes (`routes.fast`) both
    answer from here, so an error reads the same on every route."""
    if isinstance(exc, InvalidBody):  # the compiled decoder's refusal, as pydantic's reads
        return FastJSON(
            error_body("invalid_request", str(exc)) | {"detail": exc.detail}, status_code=422
        )
    if isinstance(exc, RequestError):
        status, code = request_error(exc)
        log.info("rejected %s %s: %s %s", method, path, code, exc)
        return FastJSON(error_body(code, str(exc)), status_code=status, headers=retry_headers(exc))
    if isinstance(exc, QueueUnavailable):
        log.warning("redis unavailable on %s %s: %s", method, path, exc)
        # Redis's own words name hosts and ports: they stay in the log. RedisFull's are ours.
        message = (
            str(exc) if isinstance(exc, RedisFull) else "the queue is unreachable; retry shortly"
        )
        return FastJSON(
            error_body("unavailable", message), status_code=503, headers=retry_headers(exc)
        )
    if isinstance(exc, CodecError):
        log.error("undecodable record on %s: %s", path, exc)
        return FastJSON(
            error_body("corrupt_record", "the job record could not be read"), status_code=500
        )
    return None


async def _validation(request: Request, exc: RequestValidationError) -> FastJSON:
    return validation_response(list(exc.errors()))


async def _known(request: Request, exc: Exception) -> FastJSON:
    response = error_response(exc, request.method, request.url.path)
    assert response is not None  # registered for the types `error_response` answers
    return response


async def _http(request: Request, exc: StarletteHTTPException) -> FastJSON:
    if isinstance(exc.__cause__, BodyTooLarge):  # a chunked body that outgrew the limit
        return BodyLimit.reject(parts_of(request.app.state).settings.max_body_bytes)
    return FastJSON(
        error_body("http_error", str(exc.detail)), status_code=exc.status_code, headers=exc.headers
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]
    app.add_exception_handler(RequestError, _known)
    # Redis down, loading, read-only during a failover or full under noeviction: the broker
    # raises QueueUnavailable for all of them (inferq.shared.redis_conn.unavailable).
    app.add_exception_handler(QueueUnavailable, _known)
    app.add_exception_handler(CodecError, _known)
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
