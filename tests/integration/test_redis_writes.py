"""`LeanConnection`'s write, against a real Redis and a server that never reads: a cancel that
lands while a command is written is raised, never turned into the command's reply, and a
write Redis does not take is still bounded by the socket timeout."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from inferq.shared.errors import QueueUnavailable
from inferq.shared.redis_clients import api_client, worker_client
from inferq.shared.redis_conn import unavailable


async def _cancelled_as_it_writes(client: Redis) -> bool:
    """Whether a PING cancelled at its first suspension raises CancelledError. With
    redis-py's own write (Python 3.11's `wait_for` around a task of its own) that task has
    written by the time the cancel is delivered, and the PING returns True instead."""
    await client.ping()  # connected: the next PING's first suspension is its write

    async def ping() -> bool:
        return bool(await client.ping())

    task = asyncio.create_task(ping())
    await asyncio.sleep(0)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


async def test_a_cancel_during_a_write_is_raised_not_swallowed(redis_url: str) -> None:
    for client in (
        worker_client(redis_url, block_ms=100),
        api_client(redis_url, timeout_s=2, pool_size=2),
    ):
        try:
            assert all([await _cancelled_as_it_writes(client) for _ in range(20)])
            assert await client.ping()  # and the client still works after them
        finally:
            await client.aclose()


async def test_the_library_s_own_write_swallowed_it(redis_url: str) -> None:
    """The reason for `LeanConnection`: redis-py's write with a socket timeout, as is."""
    client = Redis.from_url(redis_url, socket_timeout=2)
    try:
        assert not any([await _cancelled_as_it_writes(client) for _ in range(5)])
    finally:
        await client.aclose()


class Deafening:
    """A TCP proxy to Redis that stops reading from its clients when told (`deaf`): the
    handshake goes through, then a client's writes stall once buffers fill."""

    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.deaf = False
        self.url = ""
        self._closing = asyncio.Event()
        self._handlers: list[asyncio.Task[None]] = []

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.redis_port)

        async def back() -> None:
            while data := await up_r.read(65536):
                writer.write(data)

        pumping = asyncio.ensure_future(back())
        try:
            while not self.deaf and (data := await reader.read(65536)):
                up_w.write(data)
            await self._closing.wait()  # deaf: the connection stays open, unread
        finally:
            pumping.cancel()
            for w in (writer, up_w):
                w.close()
                with contextlib.suppress(OSError):
                    await w.wait_closed()

    async def __aenter__(self) -> Deafening:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/0"
        return self

    async def __aexit__(self, *_: object) -> None:
        self._closing.set()
        self._server.close()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5)
        await self._server.wait_closed()


async def test_a_write_redis_does_not_take_times_out_as_redis_unavailable(
    redis_url: str,
) -> None:
    async with Deafening(int(redis_url.rsplit(":", 1)[1].split("/")[0])) as proxy:
        client = worker_client(proxy.url, block_ms=0)
        conn = client.connection_pool.make_connection()
        conn.socket_timeout = 0.3
        await conn.connect()

        @unavailable
        async def write() -> None:
            await conn.send_packed_command([b"x" * (64 << 20)], check_health=False)

        proxy.deaf = True
        started = time.monotonic()
        with pytest.raises(QueueUnavailable) as raised:
            await write()
        assert 0.25 < time.monotonic() - started < 3
        assert isinstance(raised.value.__cause__, RedisTimeoutError)
        assert not conn.is_connected  # dropped, as the library drops a failed write's
        await client.aclose()
