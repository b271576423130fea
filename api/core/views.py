"""What a client sees of a job, as plain data: the routes serialise it, webhooks sign it,
batch lines record it."""

from __future__ import annotations

from typing import Any

from inferq.shared.jobs import Job


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def job_view(job: Job) -> dict[str, Any]:
    view: dict[str, Any] = {"id": job.id, "model": job.model, "status": str(job.status)}
    if job.outputs is not None:
        view["outputs"] = job.outputs
    if job.error is not None:
        view["error"] = {"code": job.error.code, "message": job.error.message}
    view["timings"] = job.timings()
    if job.worker:
        view["worker"] = job.worker
    return view


def accepted_view(job: Job) -> dict[str, Any]:
    return {"id": job.id, "status": str(job.status), "model": job.model}
