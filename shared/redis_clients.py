"""Redis clients with the timeouts and retry policy each side needs (what a call goes
through, and how its failures read, is `inferq.shared.redis_conn`).

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
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialBackoff, NoBackoff

from inferq.shared.redis_conn import RETRY_ON, MuxRedis, fast_packing, multiplexed


def _over_tcp(url: str) -> bool:
    """A `redis://` URL: plain TCP, what `redis_conn.Multiplexed` speaks (not TLS, not a socket)."""
    return urlsplit(url).scheme == "redis"


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
    multiplex: bool = False,
) -> Redis:
    """Pooled client for request handlers: waits for a free connection, never 'Too many'.
    `multiplex`: the queue's scripts share one connection (`redis_conn.Multiplexed`), where the
    URL names one server over plain TCP."""
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
    client = fast_packing(MuxRedis.from_pool(pool))  # owns its pool: closing it closes them
    return multiplexed(client, retries=1) if multiplex and _over_tcp(url) else client


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
    multiplex: bool = False,
) -> Redis:
    """Worker client; the socket timeout comfortably exceeds any BLOCK we issue. `multiplex`
    as for `api_client`, with no retry (a worker retries nothing blindly)."""
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
    client = fast_packing(MuxRedis.from_url(url, **policy, **_tls_kwargs(url)))
    return multiplexed(client, retries=0, reads=True) if multiplex and _over_tcp(url) else client


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
