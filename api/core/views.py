"""What a client sees of a job, as plain data: the routes serialise it, webhooks sign it,
batch lines record it."""

from __future__ import annotations

from typing import Any

from inferq.shared.jobs import Job, Status


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def job_view(job: Job, *, outputs: bool = True) -> dict[str, Any]:
    view: dict[str, Any] = {"id": job.id, "model": job.model, "status": str(job.status)}
    if outputs and job.outputs is not None:
        view["outputs"] = job.outputs
    if job.error is not None:
        view["error"] = {"code": job.error.code, "message": job.error.message}
    view["timings"] = job.timings()
    if job.worker:
        view["worker"] = job.worker
    # Progress: written by its worker before each batch, so it trails the batch on the device.
    view["items_total"] = job.items
    view["items_done"] = job.items if job.status is Status.SUCCEEDED else job.items_done
    if job.cancel_requested and not job.status.is_final:
        view["cancel_requested"] = True
    if job.metadata:
        view["metadata"] = job.metadata
    view["created_at"] = job.created_ms // 1000
    return view


def accepted_view(job: Job) -> dict[str, Any]:
    return {"id": job.id, "status": str(job.status), "model": job.model}
