"""bench.http, the load generators' HTTP/1.1 client, against small asyncio servers and uvicorn; and
the closed loop's window on such a server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from inferq.bench.http import Connection, HTTPError
from inferq.bench.load import Target, closed_loop

Reply = Callable[[bytes, int], bytes | None]  # (request head, n-th connection) -> raw reply


@asynccontextmanager
async def serve(reply: Reply, delay_s: float = 0.0) -> AsyncIterator[tuple[str, list[int]]]:
    """A server answering each request with `reply(head)`, `delay_s` after it arrived; None
    closes the connection. Yields its base URL and the number of requests seen on each
    connection."""
    per_conn: list[int] = []
    handlers: list[asyncio.Task[None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        per_conn.append(0)
        n = len(per_conn) - 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")),
                    0,
                )  # fmt: skip
                await reader.readexactly(length)
                per_conn[n] += 1
                await asyncio.sleep(delay_s)
                out = reply(head, n)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", per_conn
        # The client closed its connections: each handler ends on that EOF.
        await asyncio.wait_for(asyncio.gather(*handlers), timeout=5)
    finally:
        server.close()
        await server.wait_closed()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def test_keep_alive_reuses_one_connection() -> None:
    async with serve(lambda head, n: ok(head.split(b" ")[1])) as (base, per_conn):
        conn = Connection(base)
        for path in ("/a", "/b?wait=30", "/c"):
            assert await conn.request("GET", path) == (200, path.encode())
        conn.close()
    assert per_conn == [3]


async def test_sends_the_bodys_content_type() -> None:
    def reply(head: bytes, n: int) -> bytes:
        ctype = next(line for line in head.split(b"\r\n") if line.startswith(b"content-type:"))
        return ok(ctype.split(b": ", 1)[1])

    async with serve(reply) as (base, _):
        conn = Connection(base)
        assert await conn.request("POST", "/x", b"{}") == (200, b"application/json")
        multipart = "multipart/form-data; boundary=abc"
        assert await conn.request("POST", "/x", b"--abc--\r\n", multipart) == (
            200,
            multipart.encode(),
        )
        conn.close()


async def test_connection_close_and_errors_reconnect() -> None:
    def reply(head: bytes, n: int) -> bytes | None:
        path = head.split(b" ")[1]
        if path == b"/close":
            return ok(b"bye", b"Connection: close\r\n")
        if path == b"/nolength":
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        if path == b"/cut":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
        if path == b"/drop":
            return None
        return ok(b"fine")

    async with serve(reply) as (base, per_conn):
        conn = Connection(base, timeout_s=2.0)
        assert await conn.request("GET", "/close") == (200, b"bye")
        assert await conn.request("POST", "/x", b'{"input": "hi"}') == (200, b"fine")
        with pytest.raises(HTTPError, match="Content-Length"):
            await conn.request("GET", "/nolength")
        assert await conn.request("GET", "/x") == (200, b"fine")
        with pytest.raises(HTTPError, match="no complete response head"):
            await conn.request("GET", "/drop")
        assert await conn.request("GET", "/x") == (200, b"fine")
        with pytest.raises((HTTPError, TimeoutError)):
            await conn.request("GET", "/cut")  # 3 of 10 bytes, then silence: the timeout ends it
        assert await conn.request("GET", "/x") == (200, b"fine")
        conn.close()
    # Every error and the server's `Connection: close` started a new connection.
    assert per_conn == [1, 2, 2, 2, 1]


async def test_refused_connection_raises_oserror() -> None:
    async with serve(lambda head, n: ok(b"")) as (base, _):
        pass  # the port is free again
    with pytest.raises(OSError):
        await Connection(base).request("GET", "/")


def test_only_plain_http_host_port() -> None:
    for bad in ("https://127.0.0.1:1", "http://127.0.0.1", "127.0.0.1:80"):
        with pytest.raises(ValueError, match="http://host:port"):
            Connection(bad)


def test_closed_loop_counts_work_finishing_in_the_window_whenever_it_started() -> None:
    """4 clients at 0.4 s a request answer 10 requests/s. Rounds end at 0.4 and 0.8 s; the
    window is 0.2–1.0 s: both rounds count (8 in 0.8 s), where counting only requests that
    also started after 0.2 s would see the second round alone (5/s)."""

    async def run() -> float:
        async with serve(lambda head, n: ok(b'{"ok": true}'), delay_s=0.4) as (base, _):
            res = await closed_loop(
                Target((base,), "seed"), ["x"], [1], concurrency=4, duration_s=0.8, warmup_s=0.2
            )
        assert res.errors == 0
        return len(res.latencies_ms) / res.duration_s

    assert 8 <= asyncio.run(run()) <= 12


def test_a_body_that_asks_for_msgpack_gets_its_record_read_as_msgpack() -> None:
    """`Body.accept` goes out as the Accept header; a msgpack record counts when it succeeded
    (its batch size read from its timings) and is an error otherwise."""
    import msgpack

    from inferq.bench.http import Body
    from inferq.bench.load import MSGPACK

    async def run(body: Body, status: str = "succeeded") -> tuple[int, list[int]]:
        def reply(head: bytes, n: int) -> bytes:
            if b"\r\naccept: application/msgpack\r\n" not in head:
                return b"HTTP/1.1 406 Not Acceptable\r\nContent-Length: 0\r\n\r\n"
            return ok(msgpack.packb({"status": status, "timings": {"batch_size": 7}}))

        async with serve(reply) as (base, _):
            res = await closed_loop(
                Target((base,), "infer"), [body], [1], concurrency=2, duration_s=0.3
            )
        return res.errors, res.batch_sizes

    packed = Body(b'{"input": "x"}', accept=MSGPACK)
    errors, sizes = asyncio.run(run(packed))
    assert errors == 0 and sizes and set(sizes) == {7}
    errors, sizes = asyncio.run(run(packed, "failed"))
    assert errors > 0 and not sizes
    errors, sizes = asyncio.run(run(Body(b'{"input": "x"}')))  # no Accept: answered 406
    assert errors > 0 and not sizes
