"""One exception tree for inferq.

InferqError
├── CodecError            a record or message could not be encoded/decoded (cause attached)
├── QueueUnavailable      Redis did not answer in time (API: 503 + Retry-After)
└── RequestError          a client asked for something it cannot have (API: 4xx)
    ├── JobNotFound       404
    ├── ModelNotServed    404, names the models served
    └── InputRejected     413/422, names the limit
"""

from __future__ import annotations


class InferqError(Exception):
    """Base of every error inferq raises on purpose."""


class CodecError(InferqError):
    """Bytes that do not decode into what the schema says."""


class QueueUnavailable(InferqError):
    """Redis is unreachable or too slow; retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestError(InferqError):
    status_code = 400
    code = "bad_request"


class JobNotFound(RequestError):
    status_code = 404
    code = "not_found"


class ModelNotServed(RequestError):
    status_code = 404
    code = "model_not_found"


class Unauthorized(RequestError):
    status_code = 401
    code = "unauthorized"


class JobConflict(RequestError):
    status_code = 409
    code = "conflict"


class Overloaded(RequestError):
    status_code = 429
    code = "overloaded"

    def __init__(self, message: str, retry_after_s: int, reason: str = "queue_full") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason


class InputRejected(RequestError):
    code = "input_rejected"

    def __init__(self, message: str, status_code: int = 422) -> None:
        super().__init__(message)
        self.status_code = status_code
