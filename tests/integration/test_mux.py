"""`Multiplexed` (`inferq.shared.redis_conn`) against a real redis-server: many callers on one
connection each get their own reply, errors keep redis-py's types, a cancelled caller does
not shift anyone's reply, a lost or stuck connection fails its calls and the next call
connects again, and the clients the processes build carry one only where it can serve. The
queue's own scripts run through it in every test of `queue` (tests/integration/conftest.py:
pooled and multiplexed)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import AuthenticationError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from inferq.redis_server import RedisServer
from inferq.shared.errors import QueueUnavailable
from inferq.shared.redis_clients import api_client, worker_client
from inferq.shared.redis_conn import Multiplexed, MuxRedis, MuxScript, register, unavailable


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@pytest.fixture
async def mux(redis_url: str) -> AsyncIterator[Multiplexed]:
    m = Multiplexed("127.0.0.1", _port(redis_url), timeout_s=5, connect_timeout_s=5)
    yield m
    await m.aclose()


async def test_many_callers_each_get_their_own_reply(mux: Multiplexed) -> None:
    replies = await asyncio.gather(*(mux.call("ECHO", f"caller {i}") for i in range(500)))
    assert replies == [f"caller {i}".encode() for i in range(500)]
    # Commands of one turn go out in order on one connection: INCRs count up in call order.
    assert await asyncio.gather(*(mux.call("INCR", "n") for _ in range(50))) == list(range(1, 51))


async def test_error_replies_keep_redis_pys_types(mux: Multiplexed) -> None:
    with pytest.raises(NoScriptError):
        await mux.call("EVALSHA", "0" * 40, 0)
    with pytest.raises(ResponseError, match="wrong number of arguments"):
        await mux.call("GET")
    # The connection goes on: an error is one reply like any other.
    assert await mux.call("PING") == b"PONG"


async def test_a_script_loads_itself_after_the_server_forgets_it(redis_url: str) -> None:
    client = api_client(redis_url, timeout_s=5, pool_size=4, multiplex=True)
    try:
        script = register(client, "return ARGV[1] .. KEYS[1]")
        assert isinstance(script, MuxScript)
        assert await script(keys=["k"], args=["v"]) == b"vk"
        await client.script_flush()
        assert await script(keys=["k"], args=["w"]) == b"wk"
        # In a pipeline, the script goes redis-py's way (and pipelines as before).
        async with client.pipeline(transaction=False) as p:
            await script(keys=["a"], args=["b"], client=p)
            assert await p.execute() == [b"ba"]
    finally:
        await client.aclose()


async def test_a_cancelled_caller_does_not_take_anothers_reply(
    mux: Multiplexed, redis_url: str
) -> None:
    await mux.call("PING")
    admin = redis.Redis.from_url(redis_url)
    admin.client_pause(300)  # every command waits: the first caller is cancelled meanwhile
    try:
        first = asyncio.create_task(mux.call("ECHO", "first"))
        second = asyncio.create_task(mux.call("ECHO", "second"))
        await asyncio.sleep(0.05)
        first.cancel()
        assert await asyncio.wait_for(second, 5) == b"second"
        assert first.cancelled()
        assert await mux.call("ECHO", "third") == b"third"
    finally:
        admin.close()


async def test_a_stuck_connection_times_out_and_the_next_call_connects_again(
    redis_url: str,
) -> None:
    mux = Multiplexed("127.0.0.1", _port(redis_url), timeout_s=0.2, connect_timeout_s=5)
    admin = redis.Redis.from_url(redis_url)
    try:
        await mux.call("PING")
        admin.client_pause(1000)
        calls = [asyncio.create_task(mux.call("ECHO", str(i))) for i in range(3)]
        for call in calls:  # all of them: the connection is dropped, not just the oldest
            with pytest.raises(RedisTimeoutError):
                await asyncio.wait_for(call, 5)
        admin.client_unpause()
        assert await mux.call("ECHO", "after") == b"after"
    finally:
        admin.client_unpause()
        admin.close()
        await mux.aclose()


async def test_a_lost_connection_fails_its_calls_and_a_retry_rides_the_next(
    redis_url: str,
) -> None:
    admin = redis.Redis.from_url(redis_url)
    once = Multiplexed("127.0.0.1", _port(redis_url), timeout_s=5, retries=0)
    twice = Multiplexed("127.0.0.1", _port(redis_url), timeout_s=5, retries=1)
    try:
        await once.call("PING")
        await twice.call("PING")
        admin.client_pause(200)  # both calls are in flight when their connections go
        lost = asyncio.create_task(once.call("ECHO", "lost"))
        survives = asyncio.create_task(twice.call("ECHO", "survives"))
        await asyncio.sleep(0.05)
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(lost, 5)
        # The retry went out on a new connection and was answered there.
        assert await asyncio.wait_for(survives, 5) == b"survives"
        assert await once.call("PING") == b"PONG"  # the next call connects again
    finally:
        admin.close()
        await once.aclose()
        await twice.aclose()


async def test_a_server_gone_is_queue_unavailable(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "r", appendonly=False)
    server.start()
    client = api_client(server.url, timeout_s=1, pool_size=4, multiplex=True)
    script = register(client, "return 1")
    try:
        assert await script() == 1
        server.stop()

        @unavailable
        async def call() -> object:
            return await script()

        with pytest.raises(QueueUnavailable):
            await call()
        server.start()
        assert await call() == 1
    finally:
        await client.aclose()
        server.stop()


async def test_credentials_and_database_come_from_the_url() -> None:
    with tempfile.TemporaryDirectory() as d:
        server = RedisServer(Path(d), appendonly=False, password="s3cret")
        server.start()
        try:
            url = server.url.replace("/0", "/3")
            client = worker_client(url, block_ms=100, multiplex=True)
            try:
                script = register(client, "return redis.call('SET', KEYS[1], ARGV[1])")
                await script(keys=["where"], args=["db3"])
                assert await client.get("where") == b"db3"  # the pooled client, on db 3
                assert await client.mux.call("GET", "where") == b"db3"  # type: ignore[union-attr]
            finally:
                await client.aclose()
            wrong = Multiplexed("127.0.0.1", server.port, hello=[("AUTH", "nope")], retries=0)
            with pytest.raises(AuthenticationError):
                await wrong.call("PING")
            await wrong.aclose()
        finally:
            server.stop()


def test_only_a_plain_tcp_client_gets_a_connection_to_share() -> None:
    """And only a worker's gets a second, for its reads."""
    plain = api_client("redis://127.0.0.1:6390/0", timeout_s=1, pool_size=2, multiplex=True)
    off = api_client("redis://127.0.0.1:6390/0", timeout_s=1, pool_size=2, multiplex=False)
    tls = api_client("rediss://127.0.0.1:6390/0", timeout_s=1, pool_size=2, multiplex=True)
    sock = worker_client("unix:///tmp/none.sock", block_ms=100, multiplex=True)
    worker = worker_client("redis://127.0.0.1:6390/0", block_ms=100, multiplex=True)
    assert isinstance(plain, MuxRedis) and plain.mux is not None and plain.reads is None
    assert isinstance(worker, MuxRedis) and worker.mux is not None and worker.reads is not None
    assert worker.reads.timeout_s is not None and worker.reads.timeout_s > 0.1  # past a BLOCK
    for client in (off, tls, sock):
        assert getattr(client, "mux", None) is None and getattr(client, "reads", None) is None
    script = register(off, "return 1")
    assert not isinstance(script, MuxScript)


async def test_a_cancelled_blocking_read_is_given_up_on_a_workers_read_connection(
    redis_url: str,
) -> None:
    """A worker's reads go on a connection that a cancelled call closes (`drop_on_cancel`),
    as redis-py's does: the server drops the blocked XREADGROUP, so an entry added after is
    read by the next call. On a shared connection the server would keep the read and deliver
    the entry to a caller that is gone, into the consumer's pending list, and the next read
    of new entries would find nothing."""
    r = redis.asyncio.Redis.from_url(redis_url)
    kwargs = r.connection_pool.connection_kwargs | {"socket_timeout": 10}

    def read(block: tuple[str, int] | tuple[()] = ()) -> tuple[object, ...]:
        return ("XREADGROUP", "GROUP", "g", "c", "COUNT", 1, *block, "STREAMS", "s", ">")

    async def blocked(n: int) -> None:
        for _ in range(500):
            if int((await r.info("clients"))["blocked_clients"]) == n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"not {n} blocked clients within 5 s")

    async def cancel_a_blocked_read(link: Multiplexed) -> None:
        call = asyncio.ensure_future(link.call(*read(("BLOCK", 5000))))
        await blocked(1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    try:
        await r.xgroup_create("s", "g", id="0", mkstream=True)
        reads = Multiplexed.of(kwargs, retries=0, drop_on_cancel=True)
        await cancel_a_blocked_read(reads)
        await blocked(0)
        await r.xadd("s", {"job": "j1"})
        assert (await reads.call(*read()))[0][1][0][1] == [b"job", b"j1"]
        await reads.aclose()

        shared = Multiplexed.of(kwargs, retries=0)  # the scripts' kind: a cancel closes nothing
        await cancel_a_blocked_read(shared)
        await r.xadd("s", {"job": "j2"})
        assert await shared.call(*read()) is None  # j2 went to the cancelled read
        assert (await r.xpending("s", "g"))["pending"] == 2
        await shared.aclose()
    finally:
        await r.aclose()
