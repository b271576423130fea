"""Redis clients with the timeouts and retry policy each side needs, and the one place
where Redis failures become `QueueUnavailable`.

The API must answer 503 quickly when Redis is gone (short socket timeouts, one retry);
a worker's blocking XREADGROUP needs a socket timeout longer than its BLOCK, or the
read raises and drops a connection that the server already delivered entries on.
TLS (`rediss://`) verifies certificates and host names explicitly.

With `INFERQ_REDIS_SENTINELS` set, every client finds the master through the sentinels
(redis-py's `SentinelConnectionPool`) and follows it across a failover: every (re)connect
asks the sentinels where the master is (`FollowingConnection`), and a connection that fails,
or meets a demoted master (READONLY), is dropped and reconnects to wherever they point. Each
client keeps its own timeouts and retry policy; the password, database and TLS still come
from `INFERQ_REDIS_URL` (its host and port are then unused).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar, cast
from urllib.parse import urlsplit

import hiredis
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import (
    ClusterDownError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
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
    ClusterDownError,
    SlotNotCoveredError,  # no live node serves a slot (mid-failover)
    OSError,
)
# Redis before 7 reports a write refused inside a Lua script as a generic script error
# ("ERR Error running script ...: -OOM command not allowed ..."), which redis-py cannot type.
_REFUSALS_IN_SCRIPTS = ("OOM command not allowed", "READONLY", "MASTERDOWN", "TRYAGAIN")
# Refusals redis-py leaves as a plain ResponseError, by their error code: too few replicas
# for min-replicas-to-write, a failed RDB save under stop-writes-on-bgsave-error, a script
# running past its time limit, still loading, and OOM where it is not typed (a pipeline, a
# script on Redis 7). Each passes: retrying later can succeed.
_REFUSAL_CODES = ("NOREPLICAS", "MISCONF", "BUSY", "LOADING", "OOM", "READONLY", "MASTERDOWN")


# redis-py puts this before the server's reply when a command of a pipeline (or of a
# MULTI/EXEC) fails: "Command # 2 (SET k 1) of pipeline caused error: NOREPLICAS ...".
_PIPELINE_PREFIX = "Command # "
_PIPELINE_SEP = " of pipeline caused error: "


def server_reply(e: ResponseError) -> str:
    """The server's error reply inside `e`, without redis-py's pipeline annotation (applied
    once per pipeline that raised it, so possibly more than once)."""
    msg = str(e)
    while msg.startswith(_PIPELINE_PREFIX) and _PIPELINE_SEP in msg:
        msg = msg.split(_PIPELINE_SEP, 1)[1]
    return msg


def is_refusal(e: ResponseError) -> bool:
    """A Redis refusal that redis-py left as a plain ResponseError, from a single command, a
    pipeline or a script: one whose error code is in `_REFUSAL_CODES` (Redis 7 puts it first,
    scripts included), or one of `REDIS_DOWN`'s inside a script error (Redis 6.2)."""
    msg = server_reply(e)
    if msg.split(" ", 1)[0] in _REFUSAL_CODES:
        return True
    return "script" in msg and any(r in msg for r in (*_REFUSALS_IN_SCRIPTS, *_REFUSAL_CODES))


def as_str(value: bytes | str) -> str:
    """A reply value as text: clients here read bytes (no `decode_responses`), fakeredis and
    a few replies give str."""
    return value.decode() if isinstance(value, bytes) else value


RETRY_ON = (RedisConnectionError, RedisTimeoutError, ConnectionResetError, OSError)

P = ParamSpec("P")
T = TypeVar("T")


def torn_connection(e: BaseException) -> bool:
    """A write on a connection torn down under it, raised from inside redis-py's connection
    code rather than as a ConnectionError: uvloop's "the handler is closed" when the server
    closed the socket during the connect handshake, or `_writer` already None because another
    task disconnected the node's connections (a cluster client does, on a node failure).
    Seen when a cluster master is killed under load: a lost connection, not a bug of ours."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(
            "redis/asyncio/connection.py"
        ):
            return isinstance(e, RuntimeError | AttributeError)
        tb = tb.tb_next
    return False


def unavailable(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Wrap a broker call so every `REDIS_DOWN` failure leaves it as `QueueUnavailable`
    (cause attached): callers above the broker handle one error type, not redis-py's."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except REDIS_DOWN as e:
            raise QueueUnavailable(f"redis unavailable: {type(e).__name__}: {e}") from e
        except (RuntimeError, AttributeError) as e:
            if not torn_connection(e):
                raise
            raise QueueUnavailable(f"redis unavailable: connection torn down: {e!r}") from e
        except ResponseError as e:
            if not is_refusal(e):
                raise
            raise QueueUnavailable(f"redis unavailable: {e}") from e

    return wrapper


def _tls_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("rediss://"):
        return {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    return {}


DEFAULT_MASTER = "mymaster"


def sentinel_addresses(entries: Sequence[str]) -> list[tuple[str, int]]:
    """`INFERQ_REDIS_SENTINELS` entries ('host:port', '[::1]:26379') as (host, port) pairs."""
    out = []
    for entry in entries:
        host, sep, port = entry.strip().rpartition(":")
        host = host.strip().removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"invalid INFERQ_REDIS_SENTINELS entry {entry!r}: want host:port")
        out.append((host, int(port)))
    return out


class SentinelRedis(Redis):
    """A client of a Sentinel-managed master that also closes its sentinel connections."""

    sentinels: Sentinel | None = None  # not `sentinel`: that is the SENTINEL command

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        # Only the client master_for made holds them; those made by .client() share its pool.
        if self.sentinels is not None:
            await self.sentinels.aclose()


class FollowingConnection(SentinelManagedConnection):
    """A master connection that asks the sentinels where the master is on *every* connect.

    redis-py's own asks only in `connect()`; a command sent on a dropped connection (the
    retry after a failover error) reconnects through `connect_check_health`, to the address
    the connection last had: the old master (redis-py #3874, open). Here both paths resolve.
    """

    async def connect(self) -> None:
        await self.retry.call_with_retry(
            lambda: self.connect_check_health(
                check_health=self.connection_pool.check_connection, retry_socket_connect=False
            ),
            lambda error: asyncio.sleep(0),
        )

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if self.is_connected:
            return
        self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(
            check_health=check_health, retry_socket_connect=retry_socket_connect
        )


class FollowingSSLConnection(FollowingConnection, SSLConnection):
    pass


class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """The API's pool in Sentinel mode: the master's address from the sentinels, and a caller
    waits up to `timeout` for a free connection (never 'Too many connections')."""


#: Argument types packed as hiredis packs them, grown by `_learn`: exactly str, bytes and
#: int, and each str subclass met (the schema's StrEnum field names: a str either way). An
#: int subclass (bool, IntEnum) is never added, and goes the library's way.
_PLAIN: set[type] = {str, bytes, int}


def _learn(kinds: set[type]) -> bool:
    """Whether every type in `kinds` packs plainly, remembering the str subclasses."""
    if not all(issubclass(k, str) and not issubclass(k, int) for k in kinds - _PLAIN):
        return False
    _PLAIN.update(kinds)  # a set's update is atomic under the GIL: threads may share it
    return True


class FastPacker:
    """hiredis's command packer without redis-py's pass over each argument in Python
    (`HiredisRespSerializer`: two generator passes and an encoder call an argument, ~0.4 µs;
    a 48-argument FINISH packs in ~6 µs instead of ~25). Only commands whose arguments are
    all str (or a str enum), bytes or int take this way, which packs them to the same bytes (a
    test holds it); anything else (a float, a memoryview, a bool, an int enum, a two-word
    command name) goes the library's way, with its checks. The types are checked as one set
    (`map(type, ...)`, no Python call an argument)."""

    __slots__ = ("_library",)

    def __init__(self, library: Any) -> None:
        self._library = library

    def pack(self, *args: Any) -> list[bytes]:
        first = args[0]
        if type(first) is str and " " not in first:
            kinds = set(map(type, args))
            if kinds <= _PLAIN or _learn(kinds):
                return [hiredis.pack_command(args)]
        return cast(list[bytes], self._library.pack(*args))


class LeanConnection:
    """What `fast_packing` mixes into a pool's connection class (first in its MRO).

    `send_packed_command`: redis-py bounds each write by `socket_timeout` with
    `asyncio.wait_for`, which on Python 3.11 costs a task and a timer per command (~17.6 µs of
    CPU against ~6.2 for `asyncio.timeout`; docs/benchmarks.md) and, when the write is done by
    the time a cancel lands, returns instead of raising: a worker's cancelled loop went on
    reading past its stop, and took a job its successor then never saw
    (tests/integration/test_redis_writes.py). `asyncio.timeout` bounds the same write with
    neither. The library's method still does the write and its error
    handling; it only finds no timeout to apply."""

    socket_timeout: float | None
    is_connected: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        packer = getattr(self, "_command_packer", None)
        if packer is not None:
            self._command_packer = FastPacker(packer)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        timeout = self.socket_timeout
        if not timeout:
            return await super().send_packed_command(command, check_health)  # type: ignore[misc,no-any-return]
        # Connecting and the health check keep their own timeouts, as in the library.
        if not self.is_connected:
            await self.connect_check_health(check_health=False)  # type: ignore[attr-defined]
        if check_health:
            await self.check_health()  # type: ignore[attr-defined]
        self.socket_timeout = None  # one command at a time on a connection: no one else reads it
        try:
            async with asyncio.timeout(timeout):
                await super().send_packed_command(command, False)  # type: ignore[misc]
        except TimeoutError as e:  # only ours: the library turns the OS's into ConnectionError
            raise RedisTimeoutError("Timeout writing to socket") from e
        finally:
            self.socket_timeout = timeout


_LEAN_CLASSES: dict[type, type] = {}


def fast_packing(client: Redis) -> Redis:
    """`client`, its pool's connections packing commands with `FastPacker` (where redis-py
    packs with hiredis at all) and writing them without a task per command
    (`LeanConnection`); a cluster client's nodes keep redis-py's own."""
    pool = client.connection_pool
    base = pool.connection_class
    if base not in _LEAN_CLASSES:
        _LEAN_CLASSES[base] = type(base.__name__, (LeanConnection, base), {})
    pool.connection_class = _LEAN_CLASSES[base]
    return client


def _via_sentinels(
    url: str,
    sentinels: Sequence[str],
    master: str,
    pool_class: type[SentinelConnectionPool],
    **connection: Any,
) -> Redis:
    """A client of `master` as the sentinels report it; `connection` as for a plain client."""
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss"):
        raise ValueError(
            f"INFERQ_REDIS_SENTINELS needs a redis:// or rediss:// INFERQ_REDIS_URL, not {scheme}://"
        )
    parsed = parse_url(url)
    # Only the credentials and the database: the master's address is the sentinels' answer.
    node: dict[str, Any] = {k: v for k, v in parsed.items() if k in ("username", "password", "db")}
    tls = _tls_kwargs(url)
    node |= {"connection_class": FollowingSSLConnection if tls else FollowingConnection, **tls}
    # Asking the sentinels must never hang a caller: one try each, bounded like a connect.
    probe_s = connection.get("socket_connect_timeout") or 5.0
    sentinel = Sentinel(
        sentinel_addresses(sentinels),
        sentinel_kwargs={
            "socket_timeout": probe_s,
            "socket_connect_timeout": probe_s,
            "retry": Retry(NoBackoff(), 0),
            **({"ssl": True, **tls} if tls else {}),
        },
        **node,
    )
    client: SentinelRedis = sentinel.master_for(
        master, redis_class=SentinelRedis, connection_pool_class=pool_class, **connection
    )
    client.sentinels = sentinel
    return client


def cluster_seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """A cluster URL naming several nodes, `redis[s]://[user:pass@]h1:p1,h2:p2,.../db`, as
    (the URL of its first node, every node). One node: ([url], [that node])."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for entry in hosts.split(","):
        host, colon, port = entry.strip().rpartition(":")
        if not colon or not port.isdigit():
            raise ValueError(f"cluster node {entry!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    first = f"{userinfo}{at}{hosts.split(',')[0].strip()}"
    return parts._replace(netloc=first).geturl(), nodes


def _cluster(url: str, policy: dict[str, Any]) -> Redis:
    """A Redis Cluster client from a URL naming one node or several (`cluster_seeds`): it
    starts from whichever answers, so a dead first node does not stop a start; `policy` as
    for a plain client."""
    node = {
        k: v
        for k, v in policy.items()
        if k in ("socket_timeout", "socket_connect_timeout", "max_connections", "retry")
    }
    first, seeds = cluster_seeds(url)
    others = [ClusterNode(host, port) for host, port in seeds[1:]]
    # A failed-over master answers nothing for a few seconds; the client reloads the slot map
    # between attempts, so a few tries ride out a failover without failing a request.
    client = RedisCluster.from_url(
        first, startup_nodes=others, cluster_error_retry_attempts=3, **node, **_tls_kwargs(url)
    )
    return cast(Redis, client)  # the commands inferq uses exist on both


def api_client(
    url: str,
    *,
    timeout_s: float,
    pool_size: int,
    sentinels: Sequence[str] = (),
    sentinel_master: str = DEFAULT_MASTER,
    cluster: bool = False,
) -> Redis:
    """Pooled client for request handlers: waits for a free connection, never 'Too many'."""
    policy: dict[str, Any] = {
        "max_connections": pool_size,
        "timeout": timeout_s,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.02), 1),
        "retry_on_error": list(RETRY_ON),
    }
    if cluster:
        # Per node, and a cluster client raises past it instead of waiting: room for bursts.
        return _cluster(url, policy | {"max_connections": 4 * pool_size})
    if sentinels:
        return fast_packing(
            _via_sentinels(url, sentinels, sentinel_master, BlockingSentinelPool, **policy)
        )
    pool = BlockingConnectionPool.from_url(url, **policy, **_tls_kwargs(url))
    return fast_packing(Redis.from_pool(pool))  # owns its pool: closing it closes them


def pubsub_client(
    url: str,
    *,
    connect_timeout_s: float,
    sentinels: Sequence[str] = (),
    sentinel_master: str = DEFAULT_MASTER,
    cluster: bool = False,
) -> Redis:
    """For the one long-lived subscriber per process: reads may idle indefinitely."""
    policy: dict[str, Any] = {
        "socket_timeout": None,
        "socket_connect_timeout": connect_timeout_s,
        "retry": Retry(ExponentialBackoff(cap=0.5), 0),
    }
    if cluster:
        return _cluster(url, policy)
    if sentinels:
        return _via_sentinels(url, sentinels, sentinel_master, SentinelConnectionPool, **policy)
    return Redis.from_url(url, **policy, **_tls_kwargs(url))


def worker_client(
    url: str,
    *,
    block_ms: int,
    sentinels: Sequence[str] = (),
    sentinel_master: str = DEFAULT_MASTER,
    cluster: bool = False,
) -> Redis:
    """Worker client; the socket timeout comfortably exceeds any BLOCK we issue."""
    policy: dict[str, Any] = {
        "socket_timeout": block_ms / 1000 + 5.0,
        "socket_connect_timeout": 5.0,
        # No blind retries: XREADGROUP '>' and XADD are not idempotent; the worker loop
        # handles connection errors itself (re-reads its PEL after reconnecting).
        "retry": Retry(ExponentialBackoff(), 0),
    }
    if cluster:
        return _cluster(url, policy)
    if sentinels:
        return fast_packing(
            _via_sentinels(url, sentinels, sentinel_master, SentinelConnectionPool, **policy)
        )
    return fast_packing(Redis.from_url(url, **policy, **_tls_kwargs(url)))


def sibling(redis: Redis) -> Redis:
    """A client of its own on the server `redis` talks to, for one long blocking read (no
    socket timeout), as `pubsub_client` makes from a URL. For a plain client only (tests
    hand the API theirs, fakeredis included): a cluster or sentinel client has no single
    server to copy."""
    if isinstance(redis, RedisCluster | SentinelRedis):
        raise TypeError("sibling() copies a plain client's connection; use pubsub_client()")
    pool = redis.connection_pool
    kwargs = pool.connection_kwargs | {"socket_timeout": None}
    return Redis.from_pool(ConnectionPool(connection_class=pool.connection_class, **kwargs))
