"""Every error the client raises, one tree; each carries what the server said.

    InferqError                        anything this client raises on purpose
    ├── APIError(status, code, message)  the API answered with an error (code: its error.code)
    │   ├── BadRequest                 400, 413, 422: this request can never succeed as sent
    │   ├── Unauthorized               401: the Bearer key is missing or unknown
    │   ├── Forbidden                  403: the key may not use this route
    │   ├── NotFound                   404: unknown or expired job, or a model not served
    │   ├── Conflict                   409: cancel of a job that already ended
    │   ├── Overloaded(retry_after_s)  429: admission refused the job (retried first)
    │   ├── Unavailable(retry_after_s) 502, 503, 504: the API or its Redis is down (retried first)
    │   ├── ServerError                500 and any other 5xx (not retried: a retry meets it again)
    │   └── InvalidResponse            a 2xx whose body is not what the API documents
    ├── JobFailed(job)                 a job the call waited for ended failed, expired or cancelled
    ├── WaitTimeout(job, timeout_s)    `wait` gave up before the job was final (a TimeoutError)
    └── TransportError(attempts)       no answer at all: refused, reset, timed out (cause attached)

`Overloaded` and `Unavailable` reach the caller only once the retry policy gives up (attempts
spent, or a Retry-After past its cap). A failed job answered by `POST /v1/infer` (413, 422,
409 or 429 with the job as the body) is a `JobFailed`, not an `APIError`: the request was
fine, the job was not.
"""

from __future__ import annotations

from inferq.client.jobs import Job


class InferqError(Exception):
    """Base of every error the client raises."""


class APIError(InferqError):
    """The API answered `status` with `{"error": {"code", "message"}}` (or a body that says
    less: `code` is then `http_<status>`)."""

    def __init__(
        self, status: int, code: str, message: str, *, retry_after_s: float | None = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


class BadRequest(APIError):
    pass


class Unauthorized(APIError):
    pass


class Forbidden(APIError):
    pass


class NotFound(APIError):
    pass


class Conflict(APIError):
    pass


class Overloaded(APIError):
    pass


class Unavailable(APIError):
    pass


class ServerError(APIError):
    pass


class InvalidResponse(APIError):
    pass


class JobFailed(InferqError):
    """The job ended `failed`, `expired` or `cancelled`; `job.error` says why."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.code = job.error.code if job.error else str(job.status)
        self.message = job.error.message if job.error else f"job {job.status}"
        super().__init__(f"job {job.id} {job.status}: {self.code}: {self.message}")


class WaitTimeout(InferqError, TimeoutError):
    """`timeout_s` passed and the job was still not final; `job` is its last state seen."""

    def __init__(self, job: Job, timeout_s: float) -> None:
        self.job = job
        self.timeout_s = timeout_s
        super().__init__(f"job {job.id} still {job.status} after {timeout_s}s")


class TransportError(InferqError):
    """No HTTP answer after `attempts` tries; the last httpx error is the `__cause__`."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(f"{message} (after {attempts} attempt{'s' * (attempts != 1)})")
        self.attempts = attempts


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: BadRequest,
    422: BadRequest,
    429: Overloaded,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
}


def error_class(status: int) -> type[APIError]:
    """The exception for an error answer with this HTTP status."""
    return _BY_STATUS.get(status, ServerError if status >= 500 else APIError)
