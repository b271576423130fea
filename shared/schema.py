"""The names both sides and the Lua scripts agree on: statuses, fields, lanes, error codes.

Defined once here; `inferq.shared.lua` injects them into every Lua script (queue, batches,
files, webhooks), the codec (`inferq.shared.jobs`) writes and reads them, and the API shows
them. Renaming a job field or status is a schema change: bump `SCHEMA_VERSION`.
"""

from __future__ import annotations

from enum import StrEnum

SCHEMA_VERSION = 1
#: The one field of a job stream entry: the job id (the record lives in `keys.job(id)`).
ENTRY_JOB = "job"


class Lane(StrEnum):
    """A priority lane: each is its own stream; workers read higher lanes first, and every
    lane still gets a turn (`inferq.worker.policy.lanes`)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


#: The lanes, highest priority first.
LANES: tuple[str, ...] = tuple(str(lane) for lane in Lane)


class Status(StrEnum):
    """A job's state; it only moves forward: queued → running → one final state."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    #: Whether the job is over (`FINAL`): a plain attribute, set on each member below, since
    #: every read, write and answer of a job asks it.
    is_final: bool


FINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.EXPIRED, Status.CANCELLED})
for _status in Status:
    _status.is_final = _status in FINAL
#: What a webhook may ask to be told of (`webhook.events`): its job's final statuses.
WEBHOOK_EVENTS: tuple[str, ...] = tuple(str(s) for s in Status if s.is_final)


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
    QUOTA = "quota"  # true: counted against its tenant's queue counters (SUBMIT), FINISH frees
    ITEMS_DONE = "items_done"  # inputs with an output: written per batch by START, and by FINISH
    CANCEL = "cancel"  # true: cancelled while running; its worker ends it at its next batch
    METADATA = "metadata"  # the caller's own labels: a small map of strings, shown and filterable
    RESULT_TTL = "result_ttl_s"  # how long the final record lives (FINISH, CACHED); absent: default
    LISTENERS = "listeners"  # API processes that wait on it, space-separated ids: FINISH tells each


class BatchStatus(StrEnum):
    """A batch's state (OpenAI's Batch API): validating → in_progress → finalizing →
    completed, or → cancelling → cancelled, expired, failed."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def timestamp(self) -> str:
        """The record field stamped when a batch enters this status (`<status>_at`)."""
        return f"{self.value}_at"


BATCH_FINAL = frozenset(
    {BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)


class BatchField(StrEnum):
    """Fields of a batch record (`keys.batch(id)`): plain strings, not msgpack."""

    ID = "id"
    TENANT = "tenant"
    STATUS = "status"
    ENDPOINT = "endpoint"
    INPUT_FILE_ID = "input_file_id"
    COMPLETION_WINDOW = "completion_window"
    CREATED_AT = "created_at"
    EXPIRES_AT = "expires_at"
    TOTAL = "total"
    COMPLETED = "completed"  # lines with an output line, moved only with the results
    FAILED = "failed"  # lines with an error line, likewise
    METADATA = "metadata"
    OUTPUT_FILE_ID = "output_file_id"
    ERROR_FILE_ID = "error_file_id"
    ERRORS = "errors"


class FileField(StrEnum):
    """Fields of a file's metadata hash (`keys.file(id)`): plain strings."""

    ID = "id"
    TENANT = "tenant"
    FILENAME = "filename"
    PURPOSE = "purpose"
    BYTES = "bytes"
    CREATED_AT = "created_at"
    EXPIRES_AT = "expires_at"


class DeliveryField(StrEnum):
    """Fields of a webhook stream entry: `{job, record}` when queued by FINISH/CACHED,
    `{delivery}` when a retry is due again; a dead letter carries job, delivery, reason."""

    JOB = ENTRY_JOB  # what FINISH and CACHED write: the same field as a job stream entry
    RECORD = "record"  # beside it: the final record (packed, no inputs), what the body is made of
    DELIVERY = "delivery"
    REASON = "reason"
