"""What a job is on the client side: `Job` and its parts, as the API's job view describes them.

Outputs keep the model's kind: vectors (every output a list of numbers, all the same length)
become one float32 array of shape (n, dim), row i for input i; labels, boxes, texts and any
other JSON value stay Python values, one per input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

# A job's outputs: a float32 (n, dim) array for a vector model, else one JSON value per input.
Outputs = np.ndarray | list[Any]


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        """Final states never change again (a running job may still go back to queued)."""
        return self not in (JobStatus.QUEUED, JobStatus.RUNNING)


@dataclass(frozen=True)
class JobError:
    """Why a job ended without outputs: `code` is the API's (`model_error`, `expired`...)."""

    code: str
    message: str


@dataclass(frozen=True)
class Timings:
    """Milliseconds per phase, `None` until known (see docs/api.md, `GET /v1/jobs/{id}`)."""

    queued_ms: int | None = None
    run_ms: int | None = None
    total_ms: int | None = None
    batch_size: int | None = None
    batch_tokens: int | None = None
    cached: bool = False


# eq=False: outputs may be an ndarray, whose `==` is elementwise, so a field-by-field
# equality would raise; compare `to_dict()` instead.
@dataclass(frozen=True, eq=False)
class Job:
    """One job as the API last showed it. `outputs` only when succeeded, `error` only when it
    ended otherwise; `position` and `eta_ms` only while queued."""

    id: str
    model: str
    status: JobStatus
    outputs: Outputs | None = None
    error: JobError | None = None
    timings: Timings = field(default_factory=Timings)
    worker: str | None = None
    position: int | None = None
    eta_ms: int | None = None
    items_total: int | None = None
    items_done: int | None = None  # trails the batch on the device while it runs
    cancel_requested: bool = False  # cancelled while running; ends `cancelled` at a batch edge
    metadata: dict[str, str] = field(default_factory=dict)  # the labels it was submitted with
    created_at: int | None = None  # Unix seconds

    def to_dict(self) -> dict[str, Any]:
        """The job as JSON-ready data, in the API's shape (arrays as lists, unset fields out)."""
        out: dict[str, Any] = {"id": self.id, "model": self.model, "status": str(self.status)}
        if self.outputs is not None:
            out["outputs"] = (
                self.outputs.tolist() if isinstance(self.outputs, np.ndarray) else self.outputs
            )
        if self.error is not None:
            out["error"] = {"code": self.error.code, "message": self.error.message}
        out["timings"] = vars(self.timings).copy()
        for name in ("worker", "items_total", "items_done", "position", "eta_ms"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.cancel_requested:
            out["cancel_requested"] = True
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        if self.created_at is not None:
            out["created_at"] = self.created_at
        return out


def as_outputs(outputs: list[Any]) -> Outputs:
    """`outputs` as a float32 (n, dim) array when every one is a list of numbers of one
    length (a vector model's); otherwise unchanged."""
    if not outputs or not all(isinstance(o, list) for o in outputs):
        return outputs
    try:
        array = np.asarray(outputs)
    except (ValueError, TypeError):  # ragged rows: not vectors
        return outputs
    # Kinds: b bool, i/u integers, f floats; O (None, dicts), U (text) and bool stay as sent.
    if array.ndim != 2 or array.shape[1] == 0 or array.dtype.kind not in "iuf":
        return outputs
    return array.astype(np.float32)
