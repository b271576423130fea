"""Which Redis failures become QueueUnavailable (503 + Retry-After), and which stay bugs; how
each client is built, with or without Sentinel (nothing here opens a socket)."""

from __future__ import annotations

import asyncio
from enum import IntEnum

import hiredis
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import Connection
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError

from inferq.shared.errors import QueueUnavailable
from inferq.shared.redis_clients import (
    BlockingSentinelPool,
    FollowingConnection,
    FollowingSSLConnection,
    SentinelRedis,
    api_client,
    cluster_seeds,
    pubsub_client,
    sentinel_addresses,
    worker_client,
)
from inferq.shared.redis_conn import FastPacker, LeanConnection, _Link, is_refusal, unavailable
from inferq.shared.schema import JobField
from inferq.shared.settings import Settings

OOM_62 = (
    "Error running script (call to f_1b2c): @user_script:12: @user_script: 12: "
    "-OOM command not allowed when used memory > 'maxmemory'."
)


def test_a_refusal_inside_a_script_on_redis_6_is_recognised() -> None:
    assert is_refusal(ResponseError(OOM_62))
    assert is_refusal(ResponseError("Error running script: -READONLY You can't write"))
    assert not is_refusal(ResponseError("Error running script: attempt to index nil"))
    assert not is_refusal(ResponseError("WRONGTYPE Operation against a key"))
    # Refusals redis-py leaves untyped, outside scripts: retry later, not a bug (503).
    assert is_refusal(ResponseError("NOREPLICAS Not enough good replicas to write."))
    assert is_refusal(ResponseError("MISCONF Redis is configured to save RDB snapshots"))
    assert not is_refusal(ResponseError("ERR unknown command 'NOPE'"))


@pytest.mark.parametrize(
    "exc", [ResponseError(OOM_62), ReadOnlyError("READONLY You can't write against a replica")]
)
async def test_refusals_become_queue_unavailable(exc: Exception) -> None:
    @unavailable
    async def call() -> None:
        raise exc

    with pytest.raises(QueueUnavailable):
        await call()


async def test_a_connection_torn_down_inside_redis_py_is_unavailable_and_nothing_else() -> None:
    from redis.asyncio.connection import Connection

    # What a killed cluster node produced: redis-py writes on a connection whose writer
    # another task already dropped (AttributeError on None, raised in its connection code).
    conn = Connection(host="127.0.0.1", port=1)

    @unavailable
    async def torn() -> None:
        await conn._send_packed_command([b"PING"])  # _writer is None: never connected

    with pytest.raises(QueueUnavailable):
        await torn()

    @unavailable
    async def ours() -> None:
        raise RuntimeError("dictionary changed size during iteration")

    with pytest.raises(RuntimeError):
        await ours()

    @unavailable
    async def also_ours() -> None:
        None.writelines([])  # type: ignore[attr-defined]

    with pytest.raises(AttributeError):
        await also_ours()


async def test_a_script_bug_stays_a_bug() -> None:
    @unavailable
    async def call() -> None:
        raise ResponseError("Error running script: attempt to compare nil with number")

    with pytest.raises(ResponseError):
        await call()


# --- Sentinel: every client finds the master through the sentinels, keeping its own policy ---

SENTINELS = ["10.0.0.1:26379", "[::1]:26380"]


def test_sentinel_addresses_parse_and_refuse_nonsense() -> None:
    assert sentinel_addresses([" s1:26379", "[::1]:26380"]) == [("s1", 26379), ("::1", 26380)]
    for bad in ("s1", "s1:", ":26379", "s1:port"):
        with pytest.raises(ValueError, match="INFERQ_REDIS_SENTINELS"):
            sentinel_addresses([bad])


async def test_without_sentinels_the_url_decides() -> None:
    client = api_client("redis://127.0.0.1:6390/0", timeout_s=2, pool_size=8)
    assert type(client.connection_pool) is BlockingConnectionPool
    await client.aclose()


async def test_api_client_via_sentinels_keeps_its_pool_and_timeouts() -> None:
    url = "redis://:s3cret@ignored-host:1/3"
    client = api_client(url, timeout_s=1.5, pool_size=8, sentinels=SENTINELS, sentinel_master="m")
    pool = client.connection_pool
    assert isinstance(pool, BlockingSentinelPool) and pool.service_name == "m"
    assert pool.max_connections == 8 and pool.timeout == 1.5  # waits for a free connection
    kw = pool.connection_kwargs
    assert kw["socket_timeout"] == 1.5 and kw["retry"].get_retries() == 1
    # The URL gives the password and db; its host and port are never used.
    assert kw["password"] == "s3cret" and kw["db"] == 3 and "host" not in kw
    assert issubclass(pool.connection_class, FollowingConnection)  # packing with FastPacker
    sentinel = pool.sentinel_manager
    assert [c.connection_pool.connection_kwargs["host"] for c in sentinel.sentinels] == [
        "10.0.0.1",
        "::1",
    ]
    assert isinstance(client, SentinelRedis) and client.sentinels is sentinel
    await client.aclose()


async def test_worker_and_subscriber_via_sentinels_keep_their_policies() -> None:
    worker = worker_client("redis://x/0", block_ms=1000, sentinels=SENTINELS)
    kw = worker.connection_pool.connection_kwargs
    assert kw["socket_timeout"] > 1.0 and kw["retry"].get_retries() == 0  # no blind retries
    sub = pubsub_client("redis://x/0", connect_timeout_s=2, sentinels=SENTINELS)
    assert sub.connection_pool.connection_kwargs["socket_timeout"] is None  # may idle forever
    for client in (worker, sub):
        assert type(client.connection_pool) is SentinelConnectionPool
        assert client.connection_pool.service_name == "mymaster"
        await client.aclose()


async def test_tls_via_sentinels_verifies_and_unix_urls_are_refused() -> None:
    client = api_client("rediss://x/0", timeout_s=1, pool_size=2, sentinels=SENTINELS)
    pool = client.connection_pool
    assert issubclass(pool.connection_class, FollowingSSLConnection)
    assert pool.connection_kwargs["ssl_cert_reqs"] == "required"
    assert pool.connection_kwargs["ssl_check_hostname"] is True
    await client.aclose()
    with pytest.raises(ValueError, match="redis:// or rediss://"):
        worker_client("unix:///tmp/redis.sock", block_ms=100, sentinels=SENTINELS)


class _Pool:
    """Stands in for a SentinelConnectionPool: where the sentinels say the master is now."""

    is_master = True
    check_connection = False

    async def get_master_address(self) -> tuple[str, int]:
        return ("new-master", 6380)


async def test_every_reconnect_asks_the_sentinels(monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-py's own connection asks only in connect(); a command on a dropped connection
    reconnects through connect_check_health, to the old address (redis-py #3874)."""
    conn = FollowingConnection(connection_pool=_Pool(), host="old-master", port=6379)
    dialled: list[tuple[str, int]] = []

    async def dial() -> None:  # instead of a socket: note where it would connect
        dialled.append((conn.host, conn.port))
        raise RedisConnectionError("unreachable")

    monkeypatch.setattr(conn, "_connect", dial)
    with pytest.raises(RedisConnectionError):
        await conn.send_command("PING")  # the path a retried command takes
    with pytest.raises(RedisConnectionError):
        await conn.connect()
    assert dialled and set(dialled) == {("new-master", 6380)}


def test_a_cluster_url_may_name_several_seed_nodes() -> None:
    first, seeds = cluster_seeds("rediss://u:s3cret@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002/0")
    assert first == "rediss://u:s3cret@10.0.0.1:7000/0"  # credentials, TLS and db kept
    assert seeds == [("10.0.0.1", 7000), ("10.0.0.2", 7001), ("::1", 7002)]
    assert cluster_seeds("redis://h:6379") == ("redis://h:6379", [("h", 6379)])
    with pytest.raises(ValueError, match="not host:port"):
        cluster_seeds("redis://a:1,b")
    # Several nodes are a cluster's seeds only: elsewhere the setting refuses to start.
    with pytest.raises(ValueError, match="INFERQ_REDIS_CLUSTER=true"):
        Settings(redis_url="redis://a:1,b:2")
    assert Settings(redis_url="redis://a:1,b:2", redis_cluster=True).redis_cluster


# --- FastPacker ---

_ARG = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(list(JobField)),
)


@given(st.sampled_from(["EVALSHA", "HSET", "XADD", "SET"]), st.lists(_ARG, max_size=30))
def test_the_fast_packer_packs_as_redis_py_does(name: str, args: list[object]) -> None:
    library = Connection()._command_packer
    assert FastPacker(library).pack(name, *args) == library.pack(name, *args)


class _Shard(IntEnum):
    ONE = 1


class _Library:
    def pack(self, *args: object) -> list[bytes]:
        return [b"library"]


@pytest.mark.parametrize(
    "args",
    [
        ("SET", "k", 1.5),
        ("SET", "k", True),
        ("SET", "k", memoryview(b"v")),
        ("HGET", "k", _Shard.ONE),
        ("SCRIPT LOAD", "return 1"),
        (b"SET", "k", "v"),
    ],
)
def test_anything_but_plain_str_bytes_and_int_goes_the_librarys_way(args: tuple) -> None:
    assert FastPacker(_Library()).pack(*args) == [b"library"]


def test_plain_and_sentinel_clients_pack_with_it() -> None:
    for client in (
        api_client("redis://127.0.0.1:1", timeout_s=1, pool_size=2),
        worker_client("redis://127.0.0.1:1", block_ms=100),
        api_client("redis://x:1", timeout_s=1, pool_size=2, sentinels=["127.0.0.1:2"]),
        worker_client("rediss://x:1", block_ms=100, sentinels=["127.0.0.1:2"]),
    ):
        conn = client.connection_pool.make_connection()
        assert isinstance(conn._command_packer, FastPacker), client
        assert isinstance(conn, LeanConnection)  # and still the library's class (below)
        assert isinstance(conn, client.connection_pool.connection_class.__mro__[2])


class _Wire:
    """What a `_Link` writes to and aborts (no socket)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def writelines(self, data: list[bytes]) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True


async def test_a_multiplexed_link_answers_in_order_across_reads_and_turns_in_one_write() -> None:
    link, wire = _Link(timeout_s=None), _Wire()
    link.connection_made(wire)  # type: ignore[arg-type]
    calls = [link.send(hiredis.pack_command(("ECHO", str(i)))) for i in range(3)]
    await asyncio.sleep(0)  # the turn ends: its three commands leave in one write
    assert wire.written == [hiredis.pack_command(("ECHO", str(i))) for i in range(3)]
    link.data_received(b"$1\r\n0\r\n$1\r")  # a reply and a half
    assert calls[0].result() == b"0" and not calls[1].done()
    link.data_received(b"\n1\r\n-NOSCRIPT No matching script\r\n")
    assert calls[1].result() == b"1"
    assert isinstance(calls[2].exception(), NoScriptError)  # redis-py's type for it
    assert not wire.aborted


async def test_a_reply_nobody_asked_for_drops_the_link() -> None:
    link, wire = _Link(timeout_s=None), _Wire()
    link.connection_made(wire)  # type: ignore[arg-type]
    link.data_received(b"+OK\r\n")
    assert wire.aborted and isinstance(link.lost, RedisConnectionError)
    with pytest.raises(RedisConnectionError):
        link.send(b"PING")
