"""`inferq.client`: Python clients for inferq's HTTP API (`pip install 'inferq[client]'`).

`Client` (blocking) and `AsyncClient` (asyncio) share one core (`flows`), so they retry,
decode and fail alike: 429 and 503 retried after their Retry-After with capped, jittered
backoff; one Idempotency-Key per logical call, so a retry never makes a second job; results
as `Job`s whose vector outputs are float32 arrays; errors from one tree (`errors`). Job
records travel as msgpack with packed arrays by default (`packed` reads them; `compact=False`
asks for JSON).

Imports httpx and numpy only: nothing of the server (no redis, pydantic, FastAPI or msgpack).
"""

from inferq.client.aio import AsyncClient
from inferq.client.errors import (
    APIError,
    BadRequest,
    Conflict,
    Forbidden,
    InferqError,
    InvalidResponse,
    JobFailed,
    NotFound,
    Overloaded,
    ServerError,
    TransportError,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from inferq.client.jobs import Job, JobError, JobStatus, Timings
from inferq.client.retry import RetryPolicy
from inferq.client.sync import Client

__all__ = [
    "APIError",
    "AsyncClient",
    "BadRequest",
    "Client",
    "Conflict",
    "Forbidden",
    "InferqError",
    "InvalidResponse",
    "Job",
    "JobError",
    "JobFailed",
    "JobStatus",
    "NotFound",
    "Overloaded",
    "RetryPolicy",
    "ServerError",
    "Timings",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
]
