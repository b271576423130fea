"""/v1/jobs and /v1/infer: submit, read, long-poll, submit-and-wait."""

from __future__ import annotations

from fastapi import APIRouter, Query

from api.deps import Jobs
from api.responses import FastJSON, accepted_view, job_view
from api.schemas import ErrorResponse, InferRequest, JobAccepted, JobView, SubmitRequest

router = APIRouter(prefix="/v1", tags=["jobs"])

_ERRORS: dict[int | str, dict[str, object]] = {
    c: {"model": ErrorResponse} for c in (404, 413, 422, 503)
}


def _accepted(body: dict[str, object], job_id: str) -> FastJSON:
    return FastJSON(body, status_code=202, headers={"Location": f"/v1/jobs/{job_id}"})


@router.post("/jobs", status_code=202, response_model=JobAccepted, responses=_ERRORS)
async def submit_job(req: SubmitRequest, jobs: Jobs) -> FastJSON:
    """Queue a job; poll or long-poll `Location` for its result."""
    job = await jobs.submit(req.texts(), req.model)
    return _accepted(accepted_view(job), job.id)


@router.get("/jobs/{job_id}", response_model=JobView, responses=_ERRORS)
async def get_job(
    job_id: str,
    jobs: Jobs,
    wait: float = Query(
        0,
        ge=0,
        description="Long-poll: seconds to wait for a final state (capped at INFERQ_MAX_LONG_POLL_S, default 60).",
    ),
) -> FastJSON:
    """A job's state; with `wait`, answers as soon as it is final or when the wait is over."""
    job = await jobs.wait(job_id, jobs.clamp_wait(wait, 0)) if wait else await jobs.get(job_id)
    return FastJSON(job_view(job))


@router.post(
    "/infer",
    response_model=JobView,
    responses=_ERRORS | {202: {"model": JobAccepted, "description": "Not final within `wait`"}},
)
async def infer(req: InferRequest, jobs: Jobs) -> FastJSON:
    """Submit and wait: 200 with the final job, or 202 + Location if it takes longer than `wait`."""
    job = await jobs.submit(req.texts(), req.model)
    job = await jobs.wait(job.id, jobs.clamp_wait(req.wait, jobs.settings.sync_wait_s))
    if job.status.is_final:
        return FastJSON(job_view(job))
    return _accepted(accepted_view(job), job.id)
