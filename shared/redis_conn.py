"""Redis clients with the timeouts and retry policy each side needs, and the one place
where Redis failures become `QueueUnavailable`.

The API must answer 503 quickly when Redis is gone (short socket timeouts, one retry);
a worker's blocking XREADGROUP needs a socket timeout longer than its BLOCK, or the
read raises and drops a connection that the server already delivered entries on.
TLS (`rediss://`) verifies certificates and host names explicitly.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from inferq.shared.errors import QueueUnavailable

#: What "Redis cannot serve us right now" looks like, in redis-py's types and the OS's:
#: unreachable or slow, still loading its AOF (BusyLoadingError is a ConnectionError), a
#: replica that refuses writes (READONLY, during a failover), a full Redis under noeviction
#: (OOM), a master marked down or a slot being moved (TRYAGAIN). Retrying later can succeed.
REDIS_DOWN: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,
    OutOfMemoryError,
    MasterDownError,
    TryAgainError,
    OSError,
)
# Redis before 7 reports a write refused inside a Lua script as a generic script error
# ("ERR Error running script ...: -OOM command not allowed ..."), which redis-py cannot type.
_REFUSALS_IN_SCRIPTS = ("OOM command not allowed", "READONLY", "MASTERDOWN", "TRYAGAIN")


def refused_inside_script(e: ResponseError) -> bool:
    """A script error that is one of `REDIS_DOWN`'s refusals underneath (Redis 6.2)."""
    msg = str(e)
    return "script" in msg and any(r in msg for r in _REFUSALS_IN_SCRIPTS)


RETRY_ON = (RedisConnectionError, RedisTimeoutError, ConnectionResetError, OSError)

P = ParamSpec("P")
T = TypeVar("T")


def unavailable(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Wrap a broker call so every `REDIS_DOWN` failure leaves it as `QueueUnavailable`
    (cause attached): callers above the broker handle one error type, not redis-py's."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except REDIS_DOWN as e:
            raise QueueUnavailable(f"redis unavailable: {type(e).__name__}: {e}") from e
        except ResponseError as e:
            if not refused_inside_script(e):
                raise
            raise QueueUnavailable(f"redis unavailable: {e}") from e

    return wrapper


def _tls_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("rediss://"):
        return {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    return {}


def api_client(url: str, *, timeout_s: float, pool_size: int) -> Redis:
    """Pooled client for request handlers: waits for a free connection, never 'Too many'."""
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=pool_size,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 1),
        retry_on_error=list(RETRY_ON),
        **_tls_kwargs(url),
    )
    return Redis(connection_pool=pool)


def pubsub_client(url: str, *, connect_timeout_s: float) -> Redis:
    """For the one long-lived subscriber per process: reads may idle indefinitely."""
    return Redis.from_url(
        url,
        socket_timeout=None,
        socket_connect_timeout=connect_timeout_s,
        retry=Retry(ExponentialBackoff(cap=0.5), 0),
        **_tls_kwargs(url),
    )


def worker_client(url: str, *, block_ms: int) -> Redis:
    """Worker client; the socket timeout comfortably exceeds any BLOCK we issue."""
    timeout_s = block_ms / 1000 + 5.0
    return Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=5.0,
        # No blind retries: XREADGROUP '>' and XADD are not idempotent; the worker loop
        # handles connection errors itself (re-reads its PEL after reconnecting).
        retry=Retry(ExponentialBackoff(), 0),
        **_tls_kwargs(url),
    )
