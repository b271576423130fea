"""/v1/jobs and /v1/infer: submit, read, long-poll, cancel, submit-and-wait.

Both submit routes take JSON (`SubmitRequest`: text, base64 images, tensors) or
`multipart/form-data` with image parts named `files` (what a FastAPI `List[UploadFile]`
client sends) plus optional form fields `model`, `priority`, `timeout_s`, `parameters` (a
JSON object) and, for /v1/infer, `wait`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, Json, ValidationError

from inferq.api.core.decode import job_body
from inferq.api.core.errors import job_failure
from inferq.api.core.inputs import check_json_budget
from inferq.api.core.schemas import (
    ErrorResponse,
    InferRequest,
    JobAccepted,
    JobView,
    SubmitRequest,
)
from inferq.api.core.service import JobService, Submission
from inferq.api.core.views import accepted_view, job_view
from inferq.api.responses import FastJSON
from inferq.api.routes.deps import Config, IdempotencyKey, Jobs, Tenant, disconnected
from inferq.shared.errors import InputInvalid
from inferq.shared.jobs import Job, Status
from inferq.shared.schema import LANES, Lane
from inferq.shared.settings import Settings

router = APIRouter(prefix="/v1", tags=["jobs"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    c: {"model": ErrorResponse} for c in (401, 404, 409, 413, 422, 429, 503)
}


class FormFields(BaseModel):
    """The form fields beside the `files` of a multipart submission."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    priority: Lane = Lane.NORMAL
    timeout_s: float | None = Field(None, gt=0, le=86_400)
    parameters: Json[dict[str, Any]] | None = None
    wait: float | None = Field(None, ge=0)


def _body_schema(model: type[BaseModel], wait: bool) -> dict[str, Any]:
    form: dict[str, Any] = {
        "type": "object",
        "required": ["files"],
        "properties": {
            "files": {"type": "array", "items": {"type": "string", "format": "binary"}},
            "model": {"type": "string"},
            "priority": {"type": "string", "enum": list(LANES)},
            "timeout_s": {"type": "number", "exclusiveMinimum": 0},
            "parameters": {"type": "string", "description": "A JSON object."},
        },
    }
    if wait:
        form["properties"]["wait"] = {"type": "number", "minimum": 0}
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": model.model_json_schema(ref_template="#/components/schemas/{model}")
                },
                "multipart/form-data": {"schema": form},
            },
        }
    }


async def read_submission(
    request: Request, settings: Settings, tenant: str, key: str | None, *, infer: bool
) -> tuple[Submission, float | None]:
    """The request's submission and its `wait`, JSON or multipart; 4xx for anything off."""
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        async with request.form(max_files=settings.max_inputs_per_job + 1, max_fields=16) as form:
            fields = {k: v for k, v in form.multi_items() if k != "files" and isinstance(v, str)}
            uploads = [f for f in form.getlist("files") if not isinstance(f, str)]
            if not uploads:
                raise InputInvalid("multipart submission without image parts named 'files'")
            if not infer and "wait" in fields:
                raise InputInvalid("'wait' is for POST /v1/infer; GET the job with ?wait= instead")
            try:
                meta = FormFields.model_validate(fields)
            except ValidationError as e:
                raise RequestValidationError(e.errors()) from e
            # Read one byte past the limit: enough to refuse a larger image, no more.
            files = [await f.read(settings.max_image_bytes + 1) for f in uploads]
        sub = Submission(
            files=files,
            model=meta.model,
            tenant=tenant,
            priority=meta.priority,
            timeout_s=meta.timeout_s,
            idempotency_key=key,
            parameters=meta.parameters or {},
        )
        return sub, meta.wait
    return json_submission(await request.body(), settings, tenant, key, infer=infer)


def json_submission(
    raw: bytes, settings: Settings, tenant: str, key: str | None, *, infer: bool
) -> tuple[Submission, float | None]:
    """A JSON body's submission and its `wait`, decoded by compiled checks (`core.decode`:
    exactly what `SubmitRequest` / `InferRequest` document)."""
    check_json_budget(raw, settings)  # before a parse that would build every value
    req = job_body(raw, infer=infer)
    sub = Submission(
        items=req.items,
        model=req.model,
        tenant=tenant,
        priority=req.priority,
        timeout_s=req.timeout_s,
        idempotency_key=key,
        parameters=req.parameters,
        webhook=req.webhook,
        webhook_events=req.webhook_events,
    )
    return sub, req.wait


def _accepted(job: Job) -> FastJSON:
    return FastJSON(accepted_view(job), status_code=202, headers={"Location": f"/v1/jobs/{job.id}"})


async def view(jobs: JobService, job: Job) -> dict[str, object]:
    body = job_view(job)
    position, eta = await jobs.progress(job)
    if position is not None:
        body["position"], body["eta_ms"] = position, eta
    return body


@router.post(
    "/jobs",
    status_code=202,
    response_model=JobAccepted,
    responses=_ERRORS,
    openapi_extra=_body_schema(SubmitRequest, wait=False),
)
async def submit_job(
    request: Request,
    jobs: Jobs,
    settings: Config,
    tenant: Tenant,
    idempotency_key: IdempotencyKey = None,
) -> FastJSON:
    """Queue a job; poll or long-poll `Location` for its result."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return await submit_job_json(jobs, settings, tenant, idempotency_key, await request.body())
    sub, _ = await read_submission(request, settings, tenant, idempotency_key, infer=False)
    return _accepted(await jobs.submit(sub))


@router.get("/jobs/{job_id}", response_model=JobView, responses=_ERRORS)
async def get_job(
    job_id: str,
    jobs: Jobs,
    tenant: Tenant,
    wait: float = Query(
        0,
        ge=0,
        description="Long-poll: seconds to wait for a final state (capped at INFERQ_MAX_LONG_POLL_S).",
    ),
) -> FastJSON:
    """A job's state; with `wait`, answers as soon as it is final or when the wait is over."""
    return await read_job(jobs, job_id, tenant, wait)


async def read_job(jobs: JobService, job_id: str, tenant: str, wait: float) -> FastJSON:
    if wait:
        job = await jobs.wait(job_id, jobs.clamp_wait(wait, 0), tenant)
    else:
        job = await jobs.get(job_id, tenant)
    return FastJSON(await view(jobs, job))


@router.delete("/jobs/{job_id}", response_model=JobView, responses=_ERRORS)
async def cancel_job(job_id: str, jobs: Jobs, tenant: Tenant) -> FastJSON:
    """Cancel a job that has not ended: 200 with it `cancelled` when it was queued; 202 with
    `cancel_requested` when a worker runs it (it ends `cancelled`, with the outputs it has,
    at the worker's next batch boundary); 409 if it already ended."""
    job = await jobs.cancel(job_id, tenant)
    return FastJSON(job_view(job), status_code=200 if job.status.is_final else 202)


@router.post(
    "/infer",
    response_model=JobView,
    responses=_ERRORS | {202: {"model": JobAccepted, "description": "Not final within `wait`"}},
    openapi_extra=_body_schema(InferRequest, wait=True),
)
async def infer(
    request: Request,
    jobs: Jobs,
    settings: Config,
    tenant: Tenant,
    idempotency_key: IdempotencyKey = None,
) -> FastJSON:
    """Submit and wait: 200 with the final job, 202 + Location if it takes longer than `wait`.

    A job that failed answers with its view and the status of its `error.code` (e.g. 413
    `too_large`, 422 `invalid_input`). A client that disconnects while waiting cancels its
    job if no worker has started it.
    """
    sub, wait = await read_submission(request, settings, tenant, idempotency_key, infer=True)
    return await run_job(jobs, settings, sub, wait, lambda: disconnected(request))


async def submit_job_json(
    jobs: JobService, settings: Settings, tenant: str, key: str | None, raw: bytes
) -> FastJSON:
    """POST /v1/jobs with a JSON body (the hot path calls this too)."""
    sub, _ = json_submission(raw, settings, tenant, key, infer=False)
    return _accepted(await jobs.submit(sub))


async def run_job(
    jobs: JobService,
    settings: Settings,
    sub: Submission,
    wait: float | None,
    gone: Callable[[], Awaitable[None]],
) -> FastJSON:
    """POST /v1/infer once its body is read: submit, wait, answer (the hot path too)."""
    job = await jobs.run(sub, jobs.clamp_wait(wait, settings.sync_wait_s), gone)
    if job is None:
        return FastJSON({"status": "cancelled"}, status_code=499)
    if not job.status.is_final:
        return _accepted(job)
    status = 200 if job.status is Status.SUCCEEDED else job_failure(job.error and job.error.code)[0]
    return FastJSON(job_view(job), status_code=status)
