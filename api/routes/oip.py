"""/v2: the Open Inference Protocol (KServe v2, as Triton serves it over REST), on the same
submit-and-wait pipeline as /v1/infer (`JobService.run`): tenants, admission, metrics,
`Idempotency-Key` and cancel-on-disconnect are the same. The protocol itself (tensors,
metadata, the request as a job, the answers) is `inferq.api.core.oip*`.

Errors take the protocol's shape, `{"error": "<message>"}` (`core.oip_response`'s table),
the caller's key included: a tenant is checked with the function behind `deps.Tenant`,
inside the route, so a 401 reads like every other OIP error (a Triton client cannot read
inferq's nested error object). Liveness and readiness are open, as /healthz and /readyz.
Anything else under /v2 (the model repository, statistics, shared memory, trace, logging)
answers 404 in the same shape.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request, Response

from inferq.api.core.oip import check_version, inflate, parse_infer, submission
from inferq.api.core.oip_metadata import model_metadata, server_metadata
from inferq.api.core.oip_response import (
    HEADER_LENGTH,
    Reply,
    error,
    infer_reply,
    json_reply,
    late,
    refusal,
)
from inferq.api.routes import health
from inferq.api.routes.deps import Config, Jobs, Queue, Registry, authenticate, disconnected
from inferq.shared.errors import InputInvalid, RequestError
from inferq.shared.jobs import now_ms

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
        if isinstance(e, RequestError):
            log.info("rejected %s %s: %s", request.method, request.url.path, e)
        else:
            log.warning("%s %s failed: %r", request.method, request.url.path, e)
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
async def ready(settings: Config, queue: Queue, registry: Registry) -> Response:
    """Ready, exactly when /readyz is: Redis answers and the default model has a live worker
    (200; 503 otherwise, which a Triton client reads as not ready)."""
    ok = (await health.readyz(settings, queue, registry)).status_code == 200
    return Response(
        b'{"ready":true}' if ok else b'{"ready":false}',
        status_code=200 if ok else 503,
        media_type="application/json",
    )


async def _metadata(request: Request, jobs: Jobs, model: str, version: str | None) -> Response:
    async def work() -> Reply:
        await authenticate(request)
        name = jobs.catalog.resolve(model)
        check_version(name, version)
        info = await jobs.catalog.info(name)
        if info is None:  # served, but no worker has started and declared it yet
            message = f"model {name!r} has no worker yet: its inputs and outputs are unknown"
            return error(503, message, {"Retry-After": "1"})
        return json_reply(model_metadata(name, info))

    return await _answer(request, work)


@router.get("/models/{model}")
async def metadata(request: Request, jobs: Jobs, model: str) -> Response:
    """A model's metadata: versions, platform, inputs and outputs (datatype, shape)."""
    return await _metadata(request, jobs, model, None)


@router.get("/models/{model}/versions/{version}")
async def version_metadata(request: Request, jobs: Jobs, model: str, version: str) -> Response:
    """The same, for version "1" (the only one inferq serves)."""
    return await _metadata(request, jobs, model, version)


async def _model_ready(request: Request, jobs: Jobs, model: str, version: str | None) -> Response:
    async def work() -> Reply:
        await authenticate(request)
        name = jobs.catalog.resolve(model)
        check_version(name, version)
        ok = bool(await jobs.registry.live(name, now_ms()))
        return json_reply({"name": name, "ready": ok}, 200 if ok else 503)

    return await _answer(request, work)


@router.get("/models/{model}/ready")
async def model_ready(request: Request, jobs: Jobs, model: str) -> Response:
    """200 when the model has a live worker; 503 when it has none."""
    return await _model_ready(request, jobs, model, None)


@router.get("/models/{model}/versions/{version}/ready")
async def version_ready(request: Request, jobs: Jobs, model: str, version: str) -> Response:
    return await _model_ready(request, jobs, model, version)


async def _infer(
    request: Request, jobs: Jobs, settings: Config, model: str, version: str | None
) -> Response:
    async def work() -> Reply:
        tenant = await authenticate(request)
        name = jobs.catalog.resolve(model)
        check_version(name, version)
        key = _idempotency_key(request)
        raw = await request.body()
        encoding = request.headers.get("content-encoding", "identity")
        if encoding.strip().lower() != "identity":
            raw = inflate(raw, encoding, settings.max_body_bytes)
        req = parse_infer(raw, request.headers.get(HEADER_LENGTH), settings)
        info = await jobs.catalog.info(name)
        sub = submission(req, name, info, tenant, key)
        wait_s = jobs.clamp_wait(req.timeout_s, settings.sync_wait_s)
        job = await jobs.run(sub, wait_s, lambda: disconnected(request))
        if job is None:  # the client left: nobody reads this
            return error(499, "the client disconnected")
        if not job.status.is_final:
            # No way to fetch it later in this protocol: drop it unless a worker has it.
            with contextlib.suppress(RequestError):
                await jobs.cancel(job.id, tenant, only_if_queued=True)
            return late(job, wait_s)
        return infer_reply(req, job, info)

    return await _answer(request, work)


@router.post("/models/{model}/infer", openapi_extra=_BODY)
async def infer(request: Request, jobs: Jobs, settings: Config, model: str) -> Response:
    """Infer: JSON tensors, or a JSON header then binary tensors (`Inference-Header-Content-Length`).
    Waits for the result (the `timeout` parameter, else INFERQ_SYNC_WAIT_S)."""
    return await _infer(request, jobs, settings, model, None)


@router.post("/models/{model}/versions/{version}/infer", openapi_extra=_BODY)
async def version_infer(
    request: Request, jobs: Jobs, settings: Config, model: str, version: str
) -> Response:
    return await _infer(request, jobs, settings, model, version)


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
