"""The names both sides and the Lua scripts agree on: statuses, job fields, error codes.

Defined once here; `inferq.shared.scripts` injects them into every Lua script, the codec
(`inferq.shared.jobs`) writes and reads them, and the API shows them. Renaming one is a
schema change: bump `SCHEMA_VERSION`.
"""

from __future__ import annotations

from enum import StrEnum

SCHEMA_VERSION = 1
#: The one field of a job stream entry: the job id (the record lives in `keys.job(id)`).
ENTRY_JOB = "job"


class Status(StrEnum):
    """A job's state; it only moves forward: queued → running → one final state."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in FINAL


FINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.EXPIRED, Status.CANCELLED})


class ErrorCode(StrEnum):
    """`error.code` of a job that did not succeed."""

    MODEL_ERROR = "model_error"  # the model raised on this job's input (alone, after splitting)
    INVALID_INPUT = "invalid_input"  # the model could not decode or accept an input
    TOO_LARGE = "too_large"  # one input does not fit in device memory even alone
    EXPIRED = "expired"  # the deadline passed before it could run
    CANCELLED = "cancelled"  # the client cancelled it (DELETE, or left /v1/infer)
    POISONED = "poisoned"  # it was on the device at `max_deliveries` worker deaths


class InputKind(StrEnum):
    """What one input of a job is (how it travels: see `inferq.shared.jobs`)."""

    TEXT = "text"
    IMAGE = "image"  # encoded bytes (JPEG, PNG, WebP), decoded by the model's prepare
    TENSOR = "tensor"  # raw array: dtype, shape and little-endian bytes


class OutputKind(StrEnum):
    """What a model returns per input."""

    VECTOR = "vector"  # float32, one row per item (raw bytes on the wire)
    LABELS = "labels"  # [{"label", "index", "score"}, ...] per item, best first
    BOXES = "boxes"  # [{"box": [x0, y0, x1, y1], "label", "score"}, ...] per item
    TEXT = "text"  # a string per item
    ANY = "any"  # any msgpack-able value


#: dtypes a tensor input may carry (what numpy reads from bytes without surprises).
TENSOR_DTYPES = frozenset(
    {"float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"}
)


class JobField(StrEnum):
    """Fields of the job hash (`keys.job(id)`); each value is msgpack-encoded."""

    VERSION = "v"
    ID = "id"
    MODEL = "model"
    TENANT = "tenant"
    PRIORITY = "priority"
    STATUS = "status"
    INPUTS = "inputs"  # list: a str (text), {"image": bin} or {"tensor": {dtype, shape, data}}
    PARAMETERS = "parameters"  # per-request parameters for the model (a map)
    ITEMS = "items"  # number of inputs: what the job counts against the admission cap
    BYTES = "bytes"  # size of the inputs: what it counts against the queue's byte cap
    CREATED_MS = "created_ms"
    DEADLINE_MS = "deadline_ms"
    ATTEMPTS = "attempts"  # device starts, counted on the broker
    ENTRY = "entry"  # stream entry id of the current delivery
    STARTED_MS = "started_ms"
    FINISHED_MS = "finished_ms"
    OUTPUTS = "outputs"
    ERROR = "error"
    BATCH_SIZE = "batch_size"
    BATCH_TOKENS = "batch_tokens"
    WORKER = "worker"  # the consumer that wrote the outcome (absent for API-side outcomes)
    WEBHOOK = "webhook"  # {"url": ...}: POSTed the job's view when final (inferq.api.webhooks)
    CACHE = "cache"  # {"key", "ttl_s", "max_bytes"}: where FINISH stores the outputs on success
    CACHED = "cached"  # true: the outputs were answered from the result cache, no worker ran
