"""/v1/jobs and /v1/infer: submit, read, long-poll, cancel, submit-and-wait."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request

from inferq.api.auth import Tenant
from inferq.api.deps import Jobs
from inferq.api.errors import request_error
from inferq.api.observability import metrics_of
from inferq.api.responses import FastJSON, accepted_view, job_view
from inferq.api.schemas import ErrorResponse, InferRequest, JobAccepted, JobView, SubmitRequest
from inferq.shared.errors import Overloaded, RequestError
from inferq.shared.jobs import Job, Status

router = APIRouter(prefix="/v1", tags=["jobs"])

_ERRORS: dict[int | str, dict[str, object]] = {
    c: {"model": ErrorResponse} for c in (401, 404, 409, 413, 422, 429, 503)
}
IdempotencyKey = Annotated[
    str | None,
    Header(max_length=256, description="Same key, same tenant, within 24 h: the same job back."),
]


def _accepted(body: dict[str, object], job_id: str) -> FastJSON:
    return FastJSON(body, status_code=202, headers={"Location": f"/v1/jobs/{job_id}"})


async def submit(
    request: Request, req: SubmitRequest, jobs: Jobs, tenant: str, key: str | None
) -> Job:
    """Submit with metrics: every accepted and every refused job is counted."""
    m = metrics_of(request.app)
    try:
        job = await jobs.submit(
            req.texts(), req.model, tenant=tenant, priority=req.priority,
            timeout_s=req.timeout_s, idempotency_key=key,
        )  # fmt: skip
    except RequestError as e:
        reason = e.reason if isinstance(e, Overloaded) else request_error(e)[1]
        m.jobs_rejected.labels(
            model=req.model or jobs.settings.default_model.name, reason=reason
        ).inc()
        raise
    m.jobs_submitted.labels(model=job.model).inc()
    return job


async def view(jobs: Jobs, job: Job) -> dict[str, object]:
    body = job_view(job)
    position, eta = await jobs.progress(job)
    if position is not None:
        body["position"], body["eta_ms"] = position, eta
    return body


@router.post("/jobs", status_code=202, response_model=JobAccepted, responses=_ERRORS)
async def submit_job(
    request: Request,
    req: SubmitRequest,
    jobs: Jobs,
    tenant: Tenant,
    idempotency_key: IdempotencyKey = None,
) -> FastJSON:
    """Queue a job; poll or long-poll `Location` for its result."""
    job = await submit(request, req, jobs, tenant, idempotency_key)
    return _accepted(accepted_view(job), job.id)


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
    if wait:
        job = await jobs.wait(job_id, jobs.clamp_wait(wait, 0), tenant)
    else:
        job = await jobs.get(job_id, tenant)
    return FastJSON(await view(jobs, job))


@router.delete("/jobs/{job_id}", response_model=JobView, responses=_ERRORS)
async def cancel_job(job_id: str, jobs: Jobs, tenant: Tenant) -> FastJSON:
    """Cancel a job that has not ended (its items are dropped before batching); 409 if it has."""
    return FastJSON(job_view(await jobs.cancel(job_id, tenant)))


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body is already read, so only that is left)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


@router.post(
    "/infer",
    response_model=JobView,
    responses=_ERRORS | {202: {"model": JobAccepted, "description": "Not final within `wait`"}},
)
async def infer(
    request: Request,
    req: InferRequest,
    jobs: Jobs,
    tenant: Tenant,
    idempotency_key: IdempotencyKey = None,
) -> FastJSON:
    """Submit and wait: 200 with the final job, 202 + Location if it takes longer than `wait`.

    413 when an input cannot fit in device memory even alone (`too_large`). A client that
    disconnects while waiting cancels its job if no worker has started it.
    """
    job = await submit(request, req, jobs, tenant, idempotency_key)
    wait_s = jobs.clamp_wait(req.wait, jobs.settings.sync_wait_s)
    queued = job if job.status is Status.QUEUED else None  # just read or created: no re-read
    waiter = asyncio.ensure_future(jobs.wait(job.id, wait_s, tenant, submitted=queued))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not waiter.done():
        waiter.cancel()
        with contextlib.suppress(RequestError):
            await jobs.cancel(job.id, tenant, only_if_queued=True)
        return FastJSON({"id": job.id, "status": "cancelled"}, status_code=499)
    job = waiter.result()
    if job.status.is_final:
        status = 413 if job.error is not None and job.error.code == "too_large" else 200
        return FastJSON(job_view(job), status_code=status)
    return _accepted(accepted_view(job), job.id)
