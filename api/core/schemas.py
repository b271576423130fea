"""Request and response models: what clients send and see (internal fields never leak)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from inferq.api.core.decode import InputItem
from inferq.shared.schema import Lane


class Webhook(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(
        ...,
        max_length=2048,
        description="http(s) URL POSTed the job's final view, signed (X-Inferq-Signature). "
        "Private, loopback and link-local targets are refused unless INFERQ_WEBHOOK_ALLOW "
        "lists them.",
    )
    events: list[Literal["succeeded", "failed", "expired", "cancelled"]] | None = Field(
        None,
        min_length=1,
        description="The final statuses to be told of; all of them when absent.",
    )


class SubmitRequest(BaseModel):
    """Exactly one of `input` (one item) or `inputs` (a list). An item is a string (text),
    `{"image": "<base64>"}` or `{"tensor": {"dtype", "shape", "data"}}`.

    The documentation of what the JSON routes take: they decode with `core.decode` (compiled
    checks, no model built per request), and a test holds the two to the same answers."""

    model_config = ConfigDict(extra="forbid", strict=True)

    inputs: list[InputItem] | None = Field(
        None, description="Inputs to run; one output each, in order."
    )
    input: InputItem | None = Field(None, description="A single input (same as inputs=[input]).")
    model: str | None = Field(None, description="Model name; default is the server's INFERQ_MODEL.")
    priority: Lane = Field(
        Lane.NORMAL,
        description="Lane: high is served first; lower lanes still get a share (no starvation).",
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        le=86_400,
        description="Deadline from now; default INFERQ_JOB_TIMEOUT_S. Past it: expired.",
    )
    parameters: dict[str, Any] = Field(
        default_factory=dict,
        description='Passed to the model, which validates them (e.g. {"top_k": 3}); names the '
        "model does not take → 422.",
    )
    webhook: Webhook | None = Field(
        None, description="Deliver the final job here (at least once, retried with backoff)."
    )
    metadata: (
        dict[
            Annotated[str, StringConstraints(max_length=64)],
            Annotated[str, StringConstraints(max_length=512)],
        ]
        | None
    ) = Field(
        None,
        max_length=16,
        description="Your own labels (at most 16 string pairs): shown wherever the job is, "
        "and a filter of GET /v1/jobs.",
    )
    result_ttl_s: int | None = Field(
        None,
        gt=0,
        description="How long the finished job is kept, in seconds; default INFERQ_RESULT_TTL_S, "
        "at most INFERQ_RESULT_TTL_MAX_S (longer → 422).",
    )

    @model_validator(mode="after")
    def _one_of(self) -> SubmitRequest:
        if (self.inputs is None) == (self.input is None):
            raise ValueError("give exactly one of 'input' (one item) or 'inputs' (a list)")
        if self.inputs is not None and not self.inputs:
            raise ValueError("'inputs' is empty: give at least one")
        return self

    def items(self) -> list[InputItem]:
        if self.inputs is not None:
            return self.inputs
        return [self.input if self.input is not None else ""]


class InferRequest(SubmitRequest):
    wait: float | None = Field(
        None,
        ge=0,
        description="Seconds to wait for the result before answering 202 (capped at INFERQ_MAX_LONG_POLL_S, default 60).",
    )


class JobAccepted(BaseModel):
    id: str
    status: str
    model: str


class ErrorBody(BaseModel):
    code: str
    message: str


class Timings(BaseModel):
    queued_ms: int | None = None
    run_ms: int | None = None
    total_ms: int | None = None
    batch_size: int | None = None
    batch_tokens: int | None = None
    cached: bool = Field(False, description="Answered from the result cache; no worker ran.")


class JobView(BaseModel):
    id: str
    model: str
    status: Literal["queued", "running", "succeeded", "failed", "expired", "cancelled"]
    outputs: list[Any] | None = Field(
        None, description="One per input: a vector, a list of labels or boxes, a text..."
    )
    error: ErrorBody | None = None
    timings: Timings
    worker: str | None = Field(None, description="The worker that wrote the outcome.")
    items_total: int = Field(description="How many inputs the job has.")
    items_done: int = Field(
        description="Inputs with an output: updated before each batch while it runs, so it "
        "trails the batch on the device; all of them once it succeeded."
    )
    cancel_requested: bool | None = Field(
        None,
        description="Cancelled while running: its worker ends it `cancelled`, with the outputs "
        "it has, at its next batch boundary.",
    )
    metadata: dict[str, str] | None = Field(None, description="The labels it was given.")
    created_at: int = Field(description="When it was accepted: Unix seconds.")
    position: int | None = Field(None, description="Jobs ahead of this one (while queued).")
    eta_ms: int | None = Field(None, description="Estimated time to result (while queued).")


class ErrorResponse(BaseModel):
    error: ErrorBody


class JobList(BaseModel):
    """A page of GET /v1/jobs, newest first (OpenAI's list shape)."""

    object: Literal["list"] = "list"
    data: list[JobView]
    first_id: str | None
    last_id: str | None = Field(
        description="Pass as `after` for the next page. A filtered page that stopped at its "
        "examination bound names the last job it examined, which may not be in `data`."
    )
    has_more: bool
