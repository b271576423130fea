"""inferq's own job API, `/v1/jobs` and `/v1/infer`, for JSON bodies, from the body to the
answer: read by the compiled decoder (`job_body`, on `core.decode`'s helpers, held to the
documented models by a test), submitted as a `Submission`, run (`run`: submit, wait, answer),
refused and answered in inferq's error shape (`{"error": {"code", "message"}}`, statuses from
`core.errors`). Multipart uploads are read by the route (`routes.jobs`), the other body
shape. `job_view` is what a client sees of a job, as plain data: the routes serialise it,
webhooks sign it, batch lines record it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from inferq.api.core.admission import ModelCatalog
from inferq.api.core.decode import (
    InputItem,
    InvalidBody,
    Submission,
    check_json_budget,
    forbid_extra,
    input_items,
    json_object,
    metadata,
    number,
    optional_str,
)
from inferq.api.core.errors import error_body, job_failure, request_error
from inferq.api.core.service import JobService
from inferq.api.protocols import Answer
from inferq.shared.errors import RequestError
from inferq.shared.jobs import Job, Status
from inferq.shared.schema import LANES, WEBHOOK_EVENTS, Lane
from inferq.shared.settings import Settings

MAX_TIMEOUT_S = 86_400
MAX_URL = 2048
_SUBMIT = frozenset(
    (
        "inputs",
        "input",
        "model",
        "priority",
        "timeout_s",
        "parameters",
        "webhook",
        "metadata",
        "result_ttl_s",
    )
)
_INFER = _SUBMIT | {"wait"}
_LANES = {lane.value: lane for lane in Lane}  # a lookup, not two Python calls (`Lane(...)`)


@dataclass(slots=True)
class JobBody:
    """A decoded `/v1/jobs` or `/v1/infer` body."""

    items: list[InputItem]
    model: str | None = None
    priority: Lane = Lane.NORMAL
    timeout_s: float | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    webhook: str | None = None
    webhook_events: tuple[str, ...] | None = None  # None: every final status
    metadata: dict[str, str] = field(default_factory=dict)
    result_ttl_s: int | None = None
    wait: float | None = None


def _webhook(value: Any) -> tuple[str, tuple[str, ...] | None] | None:
    """(url, events) of a `webhook` object; `events` None when it names none (all of them)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidBody("webhook", "Input should be an object")
    forbid_extra(value, {"url", "events"}, "webhook.")
    url = value.get("url")
    if not isinstance(url, str):
        raise InvalidBody(
            "webhook.url", "Field required" if url is None else "Input should be a valid string"
        )
    if len(url) > MAX_URL:
        raise InvalidBody("webhook.url", f"String should have at most {MAX_URL} characters")
    events = value.get("events")
    if events is None:
        return url, None
    if not isinstance(events, list) or not events:
        raise InvalidBody("webhook.events", "Input should be a non-empty list")
    for i, e in enumerate(events):
        if e not in WEBHOOK_EVENTS or not isinstance(e, str):
            raise InvalidBody(
                f"webhook.events.{i}", f"Input should be one of {list(WEBHOOK_EVENTS)}"
            )
    return url, tuple(sorted(set(events)))


def job_body(raw: bytes, *, infer: bool) -> JobBody:
    """A `/v1/jobs` (`infer=False`) or `/v1/infer` body, as `SubmitRequest` / `InferRequest`
    would take it; `InvalidBody` otherwise."""
    body = json_object(raw)
    forbid_extra(body, _INFER if infer else _SUBMIT, "")
    out = JobBody(input_items(body), model=optional_str(body.get("model"), "model"))
    priority = body.get("priority", Lane.NORMAL)
    if priority not in LANES or not isinstance(priority, str):
        raise InvalidBody("priority", "Input should be 'high', 'normal' or 'low'")
    out.priority = _LANES[priority]
    if (timeout := body.get("timeout_s")) is not None:
        out.timeout_s = number(timeout, "timeout_s", gt=0)
        if not out.timeout_s <= MAX_TIMEOUT_S:  # NaN too
            raise InvalidBody("timeout_s", f"Input should be less than or equal to {MAX_TIMEOUT_S}")
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidBody("parameters", "Input should be an object")
    out.parameters = parameters
    if (webhook := _webhook(body.get("webhook"))) is not None:
        out.webhook, out.webhook_events = webhook
    out.metadata = metadata(body.get("metadata"))
    if (ttl := body.get("result_ttl_s")) is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, int):
            raise InvalidBody("result_ttl_s", "Input should be a valid integer")
        if ttl <= 0:
            raise InvalidBody("result_ttl_s", "Input should be greater than 0")
        out.result_ttl_s = ttl
    if infer and (wait := body.get("wait")) is not None:
        out.wait = number(wait, "wait", ge=0)
    return out


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


def json_submission(
    raw: bytes, settings: Settings, tenant: str, key: str | None, *, infer: bool
) -> tuple[Submission, float | None]:
    """A JSON body's submission and its `wait`; `InvalidBody` (422) or 413 for a body it
    refuses."""
    check_json_budget(raw, settings)  # before a parse that would build every value
    req = job_body(raw, infer=infer)
    return submission(req, tenant, key), req.wait


async def run(
    service: JobService,
    settings: Settings,
    sub: Submission,
    wait: float | None,
    gone: Callable[[], Awaitable[None]],
) -> Answer:
    """`POST /v1/infer` once its body is read: submit, wait up to `wait` (or
    INFERQ_SYNC_WAIT_S), answer: the final job (200, or its error code's status), 202 with
    `Location` if it is not final by then, 499 if the client left first."""
    job = await service.run(sub, service.clamp_wait(wait, settings.sync_wait_s), gone)
    if job is None:
        return Answer(499, {"status": "cancelled"})
    if not job.status.is_final:
        return Answer(202, accepted_view(job), {"Location": f"/v1/jobs/{job.id}"})
    return Answer(final_status(job), job_view(job))


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
            req = job_body(body, infer=True)
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
