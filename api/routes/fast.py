"""The hot routes without the generic layers: raw ASGI for the requests that carry the load.

`POST /v1/jobs`, `POST /v1/infer`, `POST /v1/embeddings` with a JSON body and `GET
/v1/jobs/{id}` are answered here, before FastAPI's router, dependency solving and request
objects: a quiet request spent about as much CPU in those layers as in its own work. What
they do is the very functions the FastAPI routes call (`jobs.submit_job_json`,
`jobs.run_job`, `jobs.read_job`, `embeddings.embeddings_json`), so auth, admission,
idempotency, cancel-on-disconnect, every status and every error body, and the msgpack
answers of `/v1/infer` and `GET /v1/jobs/{id}` (`Accept`: `responses.wants_msgpack`) are the
same; the FastAPI routes stay registered, documented in the OpenAPI schema, and serve everything else
(multipart uploads, DELETE, anything this does not recognise).

It sits inside the body limit (`middleware.UploadLimit`), which refuses an oversized body
before it is read here, and both sit ahead of FastAPI's own stack (`app.InferqAPI`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferq.api.core.auth import tenant_of
from inferq.api.core.decode import InvalidBody, number
from inferq.api.handlers import error_response
from inferq.api.parts import parts_of
from inferq.api.responses import FastJSON, wants_msgpack
from inferq.api.routes import embeddings, jobs

log = logging.getLogger("inferq.api")

JOB_PREFIX = "/v1/jobs/"
MAX_IDEMPOTENCY_KEY = 256  # as the FastAPI routes' `IdempotencyKey` header declares


def _headers(scope: Scope) -> dict[bytes, bytes]:
    # The few headers read here; repeated ones take the last, as Starlette's do.
    return dict(scope["headers"])


def is_hot(scope: Scope, headers: dict[bytes, bytes] | None = None) -> bool:
    """Whether this HTTP request is one the hot path answers."""
    method, path = scope["method"], scope["path"]
    if method == "GET":
        return path.startswith(JOB_PREFIX) and "/" not in path[len(JOB_PREFIX) :]
    if method != "POST" or path not in ("/v1/jobs", "/v1/infer", "/v1/embeddings"):
        return False
    if headers is None:
        headers = _headers(scope)
    return not headers.get(b"content-type", b"").startswith(b"multipart/form-data")


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left before sending it all
            raise ConnectionResetError("client disconnected while sending the body")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _gone(receive: Receive) -> Callable[[], Awaitable[None]]:
    async def wait() -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                return

    return wait


def _idempotency_key(headers: dict[bytes, bytes]) -> str | None:
    raw = headers.get(b"idempotency-key")
    if raw is None:
        return None
    key = raw.decode("latin-1")
    if len(key) > MAX_IDEMPOTENCY_KEY:
        raise InvalidBody(
            "header.idempotency-key", f"String should have at most {MAX_IDEMPOTENCY_KEY} characters"
        )
    return key


def _wait(scope: Scope) -> float:
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    if "wait" not in query:
        return 0.0
    try:
        value = float(query["wait"])
    except ValueError as e:
        raise InvalidBody("query.wait", "Input should be a valid number") from e
    return number(value, "query.wait", ge=0)


class FastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if not is_hot(scope, headers):
            await self.app(scope, receive, send)
            return
        try:
            response = await self._answer(scope, receive, headers)
        except ConnectionResetError:
            return  # nobody is left to answer
        except Exception as e:
            known = error_response(e, scope["method"], scope["path"])
            if known is None:
                log.exception("unhandled error on %s %s", scope["method"], scope["path"])
                known = FastJSON(
                    {"error": {"code": "internal", "message": "internal server error"}},
                    status_code=500,
                )
            response = known
        await response(scope, receive, send)

    async def _answer(
        self, scope: Scope, receive: Receive, headers: dict[bytes, bytes]
    ) -> Response:
        parts = parts_of(scope["app"].state)
        service, settings = parts.jobs, parts.settings
        tenant = tenant_of(parts.api_keys, headers.get(b"authorization", b"").decode("latin-1"))
        path = scope["path"]
        # A record in msgpack if asked for: a dict lookup and a substring test when it is not.
        packed = wants_msgpack(headers.get(b"accept"))
        if scope["method"] == "GET":
            job_id = path[len(JOB_PREFIX) :]
            return await jobs.read_job(service, job_id, tenant, _wait(scope), packed=packed)
        key = _idempotency_key(headers)
        raw = await _body(receive)
        if path == "/v1/jobs":
            return await jobs.submit_job_json(service, settings, tenant, key, raw)
        if path == "/v1/infer":
            sub, wait = jobs.json_submission(raw, settings, tenant, key, infer=True)
            return await jobs.run_job(service, settings, sub, wait, _gone(receive), packed=packed)
        return await embeddings.embeddings_json(service, settings, tenant, key, raw, _gone(receive))
