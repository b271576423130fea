"""One exception tree for inferq.

InferqError
├── CodecError            a record or message could not be encoded/decoded (cause attached)
├── QueueUnavailable      Redis did not answer in time, or cannot take writes now
│   │                     (down, loading, read-only replica, out of memory); `retry_after_s`
│   └── RedisFull         Redis is past the memory high-water mark: new work waits
└── RequestError          a client asked for something it cannot have
    ├── Unauthorized      no key, or a wrong one
    ├── Forbidden         a valid key without the role the route needs (admin)
    ├── JobNotFound       no such job for this tenant
    ├── ModelNotServed    names the models served
    ├── JobConflict       the job already ended
    ├── Overloaded        the queue is full or too slow for the deadline; `retry_after_s`
    ├── InputTooLarge     an input or a job past a size limit; names the setting
    └── InputInvalid      an input that can never run; names the problem

Domain errors say what went wrong; which HTTP status and error code a client sees for each
is the API's business (`inferq.api.core.errors`), so the same error can answer differently on
the OpenAI-shaped routes. Redis failures are turned into `QueueUnavailable` at the broker's
boundary (`inferq.shared.redis_conn.unavailable`), so no caller handles redis-py's types.
"""

from __future__ import annotations


class InferqError(Exception):
    """Base of every error inferq raises on purpose."""


class CodecError(InferqError):
    """Bytes that do not decode into what the schema says."""


class QueueUnavailable(InferqError):
    """Redis is unreachable, too slow or refusing writes; retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RedisFull(QueueUnavailable):
    """Redis holds more than INFERQ_REDIS_MEMORY_HIGH_WATER of its maxmemory: the API refuses
    new work (503) so that work already accepted can still finish and be written."""


class RequestError(InferqError):
    """Something the client asked for and cannot have (a 4xx at the API)."""


class Unauthorized(RequestError):
    pass


class Forbidden(RequestError):
    pass


class JobNotFound(RequestError):
    pass


class ModelNotServed(RequestError):
    pass


class JobConflict(RequestError):
    pass


class Overloaded(RequestError):
    """Refused at admission; `reason` is `queue_full`, `queue_bytes` or `deadline`."""

    def __init__(self, message: str, retry_after_s: int, reason: str = "queue_full") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason


class InputTooLarge(RequestError):
    pass


class InputInvalid(RequestError):
    pass
