"""The hot routes without the generic layers: raw ASGI for the requests that carry the load.

`POST /v1/jobs`, `POST /v1/infer`, `POST /v1/embeddings` with a JSON body and `GET
/v1/jobs/{id}` are answered here, before FastAPI's router, dependency solving and request
objects: a quiet request spent about as much CPU in those layers as in its own work. What
they do is the very functions the FastAPI routes call (`jobs.submit_job_json`,
`protocols.v1.run`, `jobs.read_job`, `embeddings.embeddings_json`), so auth, admission,
idempotency, cancel-on-disconnect, every status and every error body, and the msgpack
answers of `/v1/infer` and `GET /v1/jobs/{id}` (`Accept`: `responses.wants_msgpack`) are the
same. Which requests come here is read off those documented routes (`HOT`, `HotTable`): the
FastAPI routes stay registered, documented in the OpenAPI schema, and serve everything else
(multipart uploads, DELETE, anything this does not recognise).

It applies the body limit itself as it reads a body (`middleware.BodyLimit`'s 413: a declared
length past it is refused before reading, a chunked body as soon as it passes it), and sits
ahead of FastAPI's own stack (`InferqAPI`, below: the app `create_app` builds).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferq.api.core.auth import tenant_of
from inferq.api.core.decode import InvalidBody, number
from inferq.api.handlers import error_response
from inferq.api.middleware import BodyLimit, BodyTooLarge
from inferq.api.parts import ApiParts
from inferq.api.protocols import v1
from inferq.api.responses import FastJSON, answer_response, wants_msgpack
from inferq.api.routes import embeddings, jobs

log = logging.getLogger("inferq.api")

MAX_IDEMPOTENCY_KEY = 256  # as the FastAPI routes' `IdempotencyKey` header declares


def _headers(scope: Scope) -> dict[bytes, bytes]:
    # The few headers read here; repeated ones take the last, as Starlette's do.
    return dict(scope["headers"])


@dataclass(frozen=True, slots=True)
class Call:
    """One hot request, read as far as every handler needs: who asks, and how to answer."""

    parts: ApiParts
    scope: Scope
    receive: Receive
    headers: dict[bytes, bytes]
    tenant: str
    packed: bool  # a record in msgpack was asked for (`Accept`)
    max_body: int  # INFERQ_MAX_BODY_BYTES


Handler = Callable[[Call], Awaitable[Response]]


async def _read(call: Call) -> Response:
    job_id = call.scope["path"].rpartition("/")[2]  # the table matched one segment after it
    wait = _wait(call.scope)
    return await jobs.read_job(call.parts.jobs, job_id, call.tenant, wait, packed=call.packed)


async def _submit(call: Call) -> Response:
    key, raw = _idempotency_key(call.headers), await _body(call.receive, call.max_body)
    return await jobs.submit_job_json(call.parts.jobs, call.parts.settings, call.tenant, key, raw)


async def _infer(call: Call) -> Response:
    key, raw, settings = (
        _idempotency_key(call.headers),
        await _body(call.receive, call.max_body),
        call.parts.settings,
    )
    sub, wait = v1.json_submission(raw, settings, call.tenant, key, infer=True)
    answer = await v1.run(call.parts.jobs, settings, sub, wait, _gone(call.receive))
    return answer_response(answer, packed=call.packed)


async def _embed(call: Call) -> Response:
    key, raw = _idempotency_key(call.headers), await _body(call.receive, call.max_body)
    service, settings = call.parts.jobs, call.parts.settings
    return await embeddings.embeddings_json(
        service, settings, call.tenant, key, raw, _gone(call.receive)
    )


#: The hot routes: the FastAPI endpoint of each documented route the hot path answers → the
#: handler that answers it here. Their methods and paths are read off the app's routes
#: (`HotTable.of`): the documented routes are the one table of both. FastAPI serves what
#: this does not take: multipart bodies, and every other route.
HOT: dict[Callable[..., Any], Handler] = {
    jobs.get_job: _read,
    jobs.submit_job: _submit,
    jobs.infer: _infer,
    embeddings.create_embeddings: _embed,
}


@dataclass(frozen=True, slots=True)
class HotTable:
    """(method, path) → handler of the hot routes, built from the app's routes: a path as
    documented, or, for a path whose last segment is one `{parameter}`, its prefix (then one
    segment, no more)."""

    exact: dict[tuple[str, str], Handler]
    prefixed: dict[tuple[str, str], Handler]  # (method, path up to its last "/")

    @classmethod
    def of(cls, routes: Iterable[BaseRoute]) -> HotTable:
        exact: dict[tuple[str, str], Handler] = {}
        prefixed: dict[tuple[str, str], Handler] = {}
        for route in routes:
            if not isinstance(route, APIRoute) or (handler := HOT.get(route.endpoint)) is None:
                continue
            head, _, last = route.path.rpartition("/")
            for method in route.methods or ():
                if last.startswith("{"):
                    prefixed[(method, head)] = handler
                else:
                    exact[(method, route.path)] = handler
        return cls(exact, prefixed)

    def handler(self, scope: Scope, headers: dict[bytes, bytes] | None = None) -> Handler | None:
        """The handler of a request the hot path answers, or None."""
        method, path = scope["method"], scope["path"]
        handler = self.exact.get((method, path))
        if handler is None:
            head, _, last = path.rpartition("/")
            handler = self.prefixed.get((method, head)) if last else None
        if handler is None or method == "GET":
            return handler
        if headers is None:
            headers = _headers(scope)
        multipart = headers.get(b"content-type", b"").startswith(b"multipart/form-data")
        return None if multipart else handler


async def _body(receive: Receive, limit: int) -> bytes:
    """The whole body; `BodyTooLarge` as soon as it passes `limit` bytes (a chunked body
    declares no length: it is counted as it comes)."""
    chunks: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left before sending it all
            raise ConnectionResetError("client disconnected while sending the body")
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _declared_too_big(headers: dict[bytes, bytes], limit: int) -> bool:
    declared = headers.get(b"content-length", b"")
    return declared.isdigit() and int(declared) > limit  # not a number: the server refuses it


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
    """The hot routes' ASGI app; anything else goes on to `app` (FastAPI's stack). It applies
    `INFERQ_MAX_BODY_BYTES` itself, as it reads the body (none of the hot routes takes an
    upload, the one route with a limit of its own), so no middleware wraps its receive and
    send."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, table: HotTable) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.table = table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        handler = self.table.handler(scope, headers)
        if handler is None:
            await self.app(scope, receive, send)
            return
        try:
            if _declared_too_big(headers, self.max_body_bytes):
                raise BodyTooLarge
            response = await handler(self._call(scope, receive, headers, self.max_body_bytes))
        except ConnectionResetError:
            return  # nobody is left to answer
        except BodyTooLarge:
            response = BodyLimit.reject(self.max_body_bytes)
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

    @staticmethod
    def _call(scope: Scope, receive: Receive, headers: dict[bytes, bytes], max_body: int) -> Call:
        parts: ApiParts = scope["app"].state.parts  # what `parts_of` reads, without a call
        tenant = tenant_of(parts.api_keys, headers.get(b"authorization", b"").decode("latin-1"))
        # A record in msgpack if asked for: a dict lookup and a substring test when it is not.
        packed = wants_msgpack(headers.get(b"accept"))
        return Call(parts, scope, receive, headers, tenant, packed, max_body)


class InferqAPI(FastAPI):
    """FastAPI, with the hot JSON routes answered ahead of its whole middleware stack: the
    body limit, then the raw-ASGI path (`FastPath`, above). Its error and telemetry wrappers,
    its own body limit and the router cost a hot request ~14 % of its API CPU (py-spy, 32
    clients) and did nothing for it (`FastPath` answers every error itself). Everything
    else goes through the stack as FastAPI builds it."""

    hot: FastPath | None = None

    async def stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # `FastPath` looks the request up once and hands what it does not take to the stack
        # (`stack`, its `app`): no second lookup here.
        if self.hot is not None and scope["type"] == "http":
            scope["app"] = self  # what Starlette sets: the routes read `app.state`
            await self.hot(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)
