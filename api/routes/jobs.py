"""/v1/jobs and /v1/infer: submit, read, long-poll, cancel, submit-and-wait.

Both submit routes take JSON (`SubmitRequest`: text, base64 images, tensors) or
`multipart/form-data` with image parts named `files` (what a FastAPI `List[UploadFile]`
client sends) plus optional form fields `model`, `priority`, `timeout_s`, `parameters` and
`metadata` (JSON objects), `result_ttl_s` and, for /v1/infer, `wait`. `GET /v1/jobs` lists
the caller's jobs (`core.listing`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, Json, ValidationError
from starlette.responses import Response

from inferq.api.core.decode import MAX_METADATA_PAIRS, InvalidBody, Submission, metadata
from inferq.api.core.listing import MAX_LIMIT, JobFilter
from inferq.api.core.schemas import (
    ErrorResponse,
    InferRequest,
    JobAccepted,
    JobList,
    JobView,
    SubmitRequest,
)
from inferq.api.core.service import JobService
from inferq.api.protocols import v1
from inferq.api.responses import MSGPACK, FastJSON, answer_response, record_response, wants_msgpack
from inferq.api.routes.deps import (
    Config,
    IdempotencyKey,
    Jobs,
    Parts,
    Tenant,
    Viewer,
    authenticate,
    disconnected,
)
from inferq.shared.errors import Forbidden, InputInvalid
from inferq.shared.jobs import Job, Status
from inferq.shared.schema import LANES, Lane
from inferq.shared.settings import Settings

router = APIRouter(prefix="/v1", tags=["jobs"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    c: {"model": ErrorResponse} for c in (401, 404, 409, 413, 422, 429, 503)
}
# The record in msgpack besides JSON (docs/api.md, "Compact answers"); errors stay JSON.
_ACCEPT = "`application/msgpack`: the record in msgpack, arrays as packed bytes; else JSON."
_PACKED: dict[int | str, dict[str, Any]] = {
    200: {"content": {MSGPACK: {"schema": {"type": "string", "format": "binary"}}}}
}


class FormFields(BaseModel):
    """The form fields beside the `files` of a multipart submission."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    priority: Lane = Lane.NORMAL
    timeout_s: float | None = Field(None, gt=0, le=86_400)
    parameters: Json[dict[str, Any]] | None = None
    metadata: Json[dict[str, str]] | None = None
    result_ttl_s: int | None = Field(None, gt=0)
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
            "metadata": {"type": "string", "description": "A JSON object of strings."},
            "result_ttl_s": {"type": "integer", "exclusiveMinimum": 0},
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
            metadata=metadata(meta.metadata),
            result_ttl_s=meta.result_ttl_s,
        )
        return sub, meta.wait
    return v1.json_submission(await request.body(), settings, tenant, key, infer=infer)


def _accepted(job: Job) -> FastJSON:
    return FastJSON(
        v1.accepted_view(job), status_code=202, headers={"Location": f"/v1/jobs/{job.id}"}
    )


async def view(jobs: JobService, job: Job) -> dict[str, object]:
    body = v1.job_view(job)
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


class ListQuery(BaseModel):
    """The query of `GET /v1/jobs` (besides `metadata[<key>]=<value>`, read as it comes)."""

    limit: int = Field(20, ge=1, le=MAX_LIMIT, description="Jobs per page.")
    after: str | None = Field(
        None, max_length=256, description="The `last_id` of the previous page: go on after it."
    )
    status: Status | None = Field(None, description="Only jobs in this status.")
    model: str | None = Field(None, max_length=256, description="Only this model's jobs.")
    created_after: int | None = Field(
        None, ge=0, description="Only jobs created at or after this time (Unix seconds)."
    )
    created_before: int | None = Field(
        None, ge=0, description="Only jobs created before this time (Unix seconds)."
    )
    include_outputs: bool = Field(False, description="Show each job's outputs too.")
    tenant: str | None = Field(
        None,
        max_length=256,
        description="Admin keys only: one tenant's jobs (an admin sees every tenant's without it).",
    )


@router.get("/jobs", response_model=JobList, responses=_ERRORS)
async def list_jobs(
    request: Request, parts: Parts, admin: Viewer, q: Annotated[ListQuery, Query()]
) -> FastJSON:
    """Your jobs, newest first, a page at a time (`after` = the previous page's `last_id`).
    Filter by status, model, creation time, and `metadata[<key>]=<value>` (repeatable: all
    must match). Records show as in `GET /v1/jobs/{id}`, without outputs unless asked."""
    if admin:
        tenants = [q.tenant] if q.tenant is not None else parts.tenants()
    elif q.tenant is not None:
        raise Forbidden("`tenant` is for admin keys: a tenant's key lists its own jobs")
    else:
        tenants = [await authenticate(request)]
    filt = JobFilter(
        status=q.status,
        model=None if q.model is None else parts.catalog.resolve(q.model),
        created_after_ms=None if q.created_after is None else q.created_after * 1000,
        created_before_ms=None if q.created_before is None else q.created_before * 1000,
        metadata=_metadata_filter(request.query_params.multi_items()),
    )
    page = await parts.listing.page(
        tenants, filt, limit=q.limit, after=q.after, outputs=q.include_outputs
    )
    data = [v1.job_view(j, outputs=q.include_outputs) for j in page.jobs]
    return FastJSON(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": page.last_id,
            "has_more": page.has_more,
        }
    )


def _metadata_filter(query: list[tuple[str, str]]) -> dict[str, str]:
    """`metadata[<key>]=<value>` query parameters (Stripe's spelling) as one map."""
    wanted: dict[str, str] = {}
    for name, value in query:
        if not name.startswith("metadata"):
            continue
        if not (name.startswith("metadata[") and name.endswith("]")) or len(name) == 10:
            raise InvalidBody(f"query.{name[:80]}", "filter by metadata as metadata[<key>]=<value>")
        wanted[name[9:-1]] = value
    if len(wanted) > MAX_METADATA_PAIRS:
        raise InvalidBody("query.metadata", f"at most {MAX_METADATA_PAIRS} metadata filters")
    return wanted


@router.get("/jobs/{job_id}", response_model=JobView, responses=_ERRORS | _PACKED)
async def get_job(
    job_id: str,
    jobs: Jobs,
    tenant: Tenant,
    wait: float = Query(
        0,
        ge=0,
        description="Long-poll: seconds to wait for a final state (capped at INFERQ_MAX_LONG_POLL_S).",
    ),
    accept: Annotated[str | None, Header(description=_ACCEPT)] = None,
) -> Response:
    """A job's state; with `wait`, answers as soon as it is final or when the wait is over."""
    return await read_job(jobs, job_id, tenant, wait, packed=wants_msgpack(accept))


async def read_job(
    jobs: JobService, job_id: str, tenant: str, wait: float, *, packed: bool = False
) -> Response:
    """GET /v1/jobs/{id} (the hot path too); `packed`: msgpack asked for (`wants_msgpack`)."""
    if wait:
        job = await jobs.wait(job_id, jobs.clamp_wait(wait, 0), tenant)
    else:
        job = await jobs.get(job_id, tenant)
    return record_response(await view(jobs, job), packed=packed)


@router.delete("/jobs/{job_id}", response_model=JobView, responses=_ERRORS)
async def cancel_job(job_id: str, jobs: Jobs, tenant: Tenant) -> FastJSON:
    """Cancel a job that has not ended: 200 with it `cancelled` when it was queued; 202 with
    `cancel_requested` when a worker runs it (it ends `cancelled`, with the outputs it has,
    at the worker's next batch boundary); 409 if it already ended."""
    job = await jobs.cancel(job_id, tenant)
    return FastJSON(v1.job_view(job), status_code=200 if job.status.is_final else 202)


@router.post(
    "/infer",
    response_model=JobView,
    responses=_ERRORS
    | _PACKED
    | {202: {"model": JobAccepted, "description": "Not final within `wait`"}},
    openapi_extra=_body_schema(InferRequest, wait=True),
)
async def infer(
    request: Request,
    jobs: Jobs,
    settings: Config,
    tenant: Tenant,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Submit and wait: 200 with the final job, 202 + Location if it takes longer than `wait`.

    A job that failed answers with its view and the status of its `error.code` (e.g. 413
    `too_large`, 422 `invalid_input`). A client that disconnects while waiting cancels its
    job if no worker has started it.
    """
    sub, wait = await read_submission(request, settings, tenant, idempotency_key, infer=True)
    answer = await v1.run(jobs, settings, sub, wait, lambda: disconnected(request))
    return answer_response(answer, packed=wants_msgpack(request.headers.get("accept")))


async def submit_job_json(
    jobs: JobService, settings: Settings, tenant: str, key: str | None, raw: bytes
) -> FastJSON:
    """POST /v1/jobs with a JSON body (the hot path calls this too)."""
    sub, _ = v1.json_submission(raw, settings, tenant, key, infer=False)
    return _accepted(await jobs.submit(sub))
