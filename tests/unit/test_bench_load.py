"""The closed loop's window: what it counts when a request takes a good part of it."""

from __future__ import annotations

import asyncio

from inferq.bench.load import Target, closed_loop

LATENCY_S = 0.4


async def _slow_server() -> tuple[asyncio.Server, str]:
    """Answers every request LATENCY_S after it arrived."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")),
                    0,
                )  # fmt: skip
                await reader.readexactly(length)
                await asyncio.sleep(LATENCY_S)
                body = b'{"ok": true}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def test_work_finishing_in_the_window_is_counted_whenever_it_started() -> None:
    """4 clients at 0.4 s a request answer 10 requests/s. Rounds end at 0.4 and 0.8 s; the
    window is 0.2–1.0 s: both rounds count (8 in 0.8 s), where counting only requests that
    also started after 0.2 s would see the second round alone (5/s)."""

    async def run() -> float:
        server, base = await _slow_server()
        try:
            res = await closed_loop(
                Target((base,), "seed"), ["x"], [1], concurrency=4, duration_s=0.8, warmup_s=0.2
            )
        finally:
            server.close()
            await server.wait_closed()
        assert res.errors == 0
        return len(res.latencies_ms) / res.duration_s

    assert 8 <= asyncio.run(run()) <= 12
