"""/v2: the Open Inference Protocol (KServe v2, as Triton serves it over REST), on the same
submit-and-wait pipeline as /v1/infer (`JobService.run`): tenants, admission, metrics,
`Idempotency-Key` and cancel-on-disconnect are the same. The protocol itself (tensors,
metadata, the request as a job, the answers) is `inferq.api.protocols.oip.request*`.

Errors take the protocol's shape, `{"error": "<message>"}` (`protocols.oip.response`'s table),
the caller's key included: a tenant is checked with the function behind `deps.Tenant`,
inside the route, so a 401 reads like every other OIP error (a Triton client cannot read
inferq's nested error object). Liveness and readiness are open, as /healthz and /readyz.
Anything else under /v2 (the model repository, statistics, shared memory, trace, logging)
answers 404 in the same shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request, Response

from inferq.api.core.service import JobService
from inferq.api.parts import parts_of
from inferq.api.protocols.oip.body import BodyBudget, Hold, inflate
from inferq.api.protocols.oip.metadata import model_metadata, server_metadata
from inferq.api.protocols.oip.request import OipRequest, check_version, parse_infer, submission
from inferq.api.protocols.oip.response import (
    HEADER_LENGTH,
    Reply,
    bounded,
    error,
    infer_reply,
    json_reply,
    late,
    refusal,
)
from inferq.api.routes import health
from inferq.api.routes.deps import Config, Parts, Queue, Registry, authenticate, disconnected
from inferq.shared.errors import InputInvalid, RequestError
from inferq.shared.jobs import Job, now_ms
from inferq.shared.registry import ModelInfo
from inferq.shared.settings import Settings

log = logging.getLogger("inferq.api")

router = APIRouter(prefix="/v2", tags=["oip"])

MAX_IDEMPOTENCY_KEY = 256  # as `deps.IdempotencyKey` declares it
_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


async def _answer(request: Request, work: Callable[[], Awaitable[Reply]]) -> Response:
    """`work`'s reply, or the protocol's answer to the error it met."""
    try:
        reply = await work()
    except Exception as e:
        known = refusal(e)
        if known is None:
            raise  # a bug: the app's 500
        # Bounded: a refusal's message may quote what it refuses (responses are, by `error`).
        path = bounded(request.url.path, 256)
        if isinstance(e, RequestError):
            log.info("rejected %s %s: %s", request.method, path, bounded(str(e)))
        else:
            log.warning("%s %s failed: %s", request.method, path, bounded(repr(e)))
        reply = known
    return Response(reply.body, status_code=reply.status, headers=reply.headers)


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get("idempotency-key")
    if key is not None and len(key) > MAX_IDEMPOTENCY_KEY:
        raise InputInvalid(f"Idempotency-Key has more than {MAX_IDEMPOTENCY_KEY} characters")
    return key


@router.get("")
async def server(request: Request) -> Response:
    """Server metadata: name, version, the protocol extensions served."""

    async def work() -> Reply:
        await authenticate(request)
        return json_reply(server_metadata(request.app.version))

    return await _answer(request, work)


@router.get("/health/live")
async def live() -> Response:
    """The process is alive (no Redis call)."""
    return Response(b'{"live":true}', media_type="application/json")


@router.get("/health/ready")
async def ready(settings: Config, queue: Queue, registry: Registry, parts: Parts) -> Response:
    """Ready, exactly when /readyz is: Redis answers and takes new work, and the default model
    has a live worker (200; 503 otherwise, which a Triton client reads as not ready)."""
    ok = (await health.readyz(settings, queue, registry, parts.memory)).status_code == 200
    return Response(
        b'{"ready":true}' if ok else b'{"ready":false}',
        status_code=200 if ok else 503,
        media_type="application/json",
    )


async def _metadata(request: Request, parts: Parts, model: str, version: str | None) -> Response:
    async def work() -> Reply:
        await authenticate(request)
        name = parts.catalog.resolve(model)
        check_version(name, version)
        info = await parts.catalog.info(name)
        if info is None:  # served, but no worker has started and declared it yet
            message = f"model {name!r} has no worker yet: its inputs and outputs are unknown"
            return error(503, message, {"Retry-After": "1"})
        return json_reply(model_metadata(name, info))

    return await _answer(request, work)


@router.get("/models/{model}")
async def metadata(request: Request, parts: Parts, model: str) -> Response:
    """A model's metadata: versions, platform, inputs and outputs (datatype, shape)."""
    return await _metadata(request, parts, model, None)


@router.get("/models/{model}/versions/{version}")
async def version_metadata(request: Request, parts: Parts, model: str, version: str) -> Response:
    """The same, for version "1" (the only one inferq serves)."""
    return await _metadata(request, parts, model, version)


async def _model_ready(request: Request, parts: Parts, model: str, version: str | None) -> Response:
    async def work() -> Reply:
        await authenticate(request)
        name = parts.catalog.resolve(model)
        check_version(name, version)
        ok = bool(await parts.registry.live(name, now_ms()))
        return json_reply({"name": name, "ready": ok}, 200 if ok else 503)

    return await _answer(request, work)


@router.get("/models/{model}/ready")
async def model_ready(request: Request, parts: Parts, model: str) -> Response:
    """200 when the model has a live worker; 503 when it has none."""
    return await _model_ready(request, parts, model, None)


@router.get("/models/{model}/versions/{version}/ready")
async def version_ready(request: Request, parts: Parts, model: str, version: str) -> Response:
    return await _model_ready(request, parts, model, version)


async def _infer(
    request: Request, parts: Parts, settings: Config, model: str, version: str | None
) -> Response:
    jobs = parts.jobs

    async def work() -> Reply:
        tenant = await authenticate(request)
        name = parts.catalog.resolve(model)
        check_version(name, version)
        key = _idempotency_key(request)
        info = await parts.catalog.info(name)
        req, first, created = await _submit(request, jobs, settings, name, info, tenant, key)
        wait_s = jobs.clamp_wait(req.timeout_s, settings.sync_wait_s)
        job = await jobs.follow(first, created, tenant, wait_s, lambda: disconnected(request))
        if job is None:  # the client left: nobody reads this
            return error(499, "the client disconnected")
        if not job.status.is_final:
            # No way to fetch it later in this protocol: drop it unless a worker has it, if
            # it is this request's (a repeat's job belongs to the request that made it).
            if created:
                with contextlib.suppress(RequestError):
                    await jobs.cancel(job.id, tenant, only_if_queued=True)
            return late(job, wait_s, cancelled=created)
        return infer_reply(req, job, info)

    return await _answer(request, work)


def _budget(request: Request, settings: Settings) -> BodyBudget:
    """This app's budget of body bytes in flight (`protocols.oip.body.BodyBudget`)."""
    return parts_of(request.app.state).oip_bodies


async def _read_body(request: Request, settings: Settings, hold: Hold) -> bytes | bytearray:
    """The body, each chunk held against the budget as it arrives, then inflated in a thread
    if compressed. Read from the stream: `request.body()` would keep it on the request (and
    so through the wait for the result)."""
    raw = bytearray()
    async for chunk in request.stream():
        hold.cover(len(raw) + len(chunk))
        raw += chunk
    encoding = request.headers.get("content-encoding", "identity")
    if encoding.strip().lower() == "identity":
        return raw
    return await asyncio.to_thread(inflate, raw, encoding, settings.max_body_bytes, hold)


async def _submit(
    request: Request,
    jobs: JobService,
    settings: Settings,
    name: str,
    info: ModelInfo | None,
    tenant: str,
    key: str | None,
) -> tuple[OipRequest, Job, bool]:
    """Read, parse and submit the request: (the request without its tensors, its job, whether
    this request created it). The body's bytes are held against the budget until the job is
    in Redis, and nothing refers to them once this returns."""
    with _budget(request, settings).hold() as hold:
        raw = await _read_body(request, settings, hold)
        req = parse_infer(raw, request.headers.get(HEADER_LENGTH), settings)
        del raw
        sub = submission(req, name, info, tenant, key)
        # Answered in this response, or dropped: nothing in this protocol reads it later.
        sub.answered_inline(settings)
        req.inputs = []  # views of the body: only `sub` holds them now, until it is written
        job, created = await jobs.create(sub)
        sub.items, sub.files = [], []
    return req, job, created


@router.post("/models/{model}/infer", openapi_extra=_BODY)
async def infer(request: Request, parts: Parts, settings: Config, model: str) -> Response:
    """Infer: JSON tensors, or a JSON header then binary tensors (`Inference-Header-Content-Length`).
    Waits for the result (the `timeout` parameter, else INFERQ_SYNC_WAIT_S)."""
    return await _infer(request, parts, settings, model, None)


@router.post("/models/{model}/versions/{version}/infer", openapi_extra=_BODY)
async def version_infer(
    request: Request, parts: Parts, settings: Config, model: str, version: str
) -> Response:
    return await _infer(request, parts, settings, model, version)


@router.api_route(
    "/{rest:path}",
    methods=["GET", "POST", "PUT", "DELETE", "PATCH"],
    include_in_schema=False,
)
async def not_served(rest: str) -> Response:
    """The rest of the protocol and of Triton's API, in the protocol's error shape."""
    what = f"/v2/{rest[:128]} is not part of the Open Inference Protocol subset inferq serves"
    reply = error(404, f"{what} (docs/api.md)")
    return Response(reply.body, status_code=reply.status, headers=reply.headers)
