"""POST /v1/embeddings: the OpenAI embeddings API, served through the queue like /v1/infer
(what it answers, and why: `inferq.api.protocols.embeddings`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request

from inferq.api.core.service import JobService
from inferq.api.protocols.embeddings import (
    Answer,
    EmbeddingsResponse,
    answer,
    bind,
    parse_request,
    refusal,
    submission,
)
from inferq.api.responses import FastJSON
from inferq.api.routes.deps import Config, IdempotencyKey, Jobs, Tenant, disconnected
from inferq.shared.errors import RequestError
from inferq.shared.settings import Settings

router = APIRouter(prefix="/v1", tags=["embeddings"])


def _send(a: Answer) -> FastJSON:
    return FastJSON(a.body, status_code=a.status, headers=a.headers)


@router.post(
    "/embeddings",
    response_model=EmbeddingsResponse,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/EmbeddingsRequest"}}
            },
        }
    },
)
async def create_embeddings(
    request: Request,
    jobs: Jobs,
    settings: Config,
    tenant: Tenant,
    idempotency_key: IdempotencyKey = None,
) -> FastJSON:
    """OpenAI-compatible embeddings: one vector per input, in input order."""
    gone = lambda: disconnected(request)  # noqa: E731 - called only once a job exists
    return await embeddings_json(
        jobs, settings, tenant, idempotency_key, await request.body(), gone
    )


async def embeddings_json(
    jobs: JobService,
    settings: Settings,
    tenant: str,
    key: str | None,
    raw: bytes,
    gone: Callable[[], Awaitable[None]],
) -> FastJSON:
    """The endpoint once its body is read (the hot path calls this too)."""
    req = parse_request(raw, settings.max_json_values)
    if not isinstance(req, Answer):
        req = await bind(req, jobs.catalog)
    if isinstance(req, Answer):
        return _send(req)
    try:
        sub = submission(req, tenant, idempotency_key=key)
        job = await jobs.run(sub, jobs.clamp_wait(req.wait, settings.sync_wait_s), gone)
    except RequestError as e:
        return _send(refusal(e))
    if job is None:
        return FastJSON({"status": "cancelled"}, status_code=499)
    if not job.status.is_final:
        return FastJSON(
            {"id": job.id, "status": str(job.status), "model": job.model},
            status_code=202,
            headers={"Location": f"/v1/jobs/{job.id}", "x-should-retry": "false"},
        )
    return _send(answer(req, job))
