"""inferq's own job API, `/v1/jobs` and `/v1/infer`, for JSON bodies: read by the compiled
decoder (`core.decode.job_body`, held to the documented models by a test), submitted as a
`Submission`, refused and answered in inferq's error shape (`{"error": {"code", "message"}}`,
statuses from `core.errors`). Multipart uploads are read by the route (`routes.jobs`), the
other body shape. `job_view` is what a client sees of a job, as plain data: the routes
serialise it, webhooks sign it, batch lines record it.
"""

from __future__ import annotations

from typing import Any

from inferq.api.core.catalog import ModelCatalog
from inferq.api.core.decode import InvalidBody, JobBody, job_body
from inferq.api.core.errors import error_body, job_failure, request_error
from inferq.api.core.service import Submission
from inferq.api.protocols import Answer
from inferq.shared.errors import RequestError
from inferq.shared.jobs import Job, Status


def parse(raw: bytes, *, infer: bool) -> JobBody:
    """A `/v1/jobs` (`infer=False`) or `/v1/infer` body; `InvalidBody` (422) otherwise."""
    return job_body(raw, infer=infer)


def submission(req: JobBody, tenant: str, key: str | None) -> Submission:
    """The job a body asks for, as the pipeline takes it (`JobService.submit`)."""
    return Submission(
        items=req.items,
        model=req.model,
        tenant=tenant,
        priority=req.priority,
        timeout_s=req.timeout_s,
        idempotency_key=key,
        parameters=req.parameters,
        webhook=req.webhook,
        webhook_events=req.webhook_events,
        metadata=req.metadata,
        result_ttl_s=req.result_ttl_s,
    )


def final_status(job: Job) -> int:
    """The HTTP status a final job answers with: 200, or its error code's."""
    if job.status is Status.SUCCEEDED:
        return 200
    return job_failure(job.error and job.error.code)[0]


class Infer:
    """`/v1/infer` as a batch line runs it (`batches.lines`): a line cannot ask for a webhook
    (one delivery per line of a 50,000-line batch is not what anyone wants), and its lane and
    deadline are the batch's (the line's own deadline if it is the sooner)."""

    @staticmethod
    def parse(body: bytes) -> JobBody | Answer:
        try:
            req = parse(body, infer=True)
        except InvalidBody as e:  # as the route answers it (`handlers.error_response`)
            return Answer(422, error_body("invalid_request", str(e)) | {"detail": e.detail})
        if req.webhook is not None:
            return Answer(
                422, error_body("invalid_request", "'webhook' is not supported in a batch line")
            )
        return req

    @staticmethod
    async def bind(req: JobBody, catalog: ModelCatalog) -> JobBody:
        return req  # the submission checks everything /v1/infer checks

    @staticmethod
    def submission(req: JobBody, tenant: str, **fields: Any) -> Submission:
        sub = submission(req, tenant, fields.pop("idempotency_key", None))
        if req.timeout_s is not None:  # the line's own deadline, if it is the sooner one
            fields["timeout_s"] = min(req.timeout_s, fields.get("timeout_s") or req.timeout_s)
        for name, value in fields.items():
            setattr(sub, name, value)
        return sub

    @staticmethod
    def refusal(e: RequestError) -> Answer:
        status, code = request_error(e)
        return Answer(status, error_body(code, str(e)))

    @staticmethod
    def answer(req: JobBody, job: Job) -> Answer:
        return Answer(final_status(job), job_view(job))


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
