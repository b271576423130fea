"""How many Python function calls one answered `POST /v1/infer` costs, by package: the API
(the ASGI app `create_app` builds, with its own Redis clients) and a worker (`build_worker`,
the echo model) in this process, against a redis-server started here, under `--clients`
concurrent requests. The count is exact and the same on any machine, where CPU time moves
with the box; calls into C (hiredis, msgpack's packer, orjson) are one call or none, so it
counts the Python layers a request crosses, not their weight.

Requests go to the app as ASGI calls (no HTTP server, no client library), so every call
counted is the stack's own. A coroutine is counted at each resume, as the profiler sees it.

Run: .venv/bin/python scripts/call_count.py [--clients 32] [--requests 40] [--top 30] [--inputs 1]
     [--loop asyncio|uvloop]
`--loop uvloop` runs the event loop the API (uvicorn) and the worker run on: its loop
machinery is C, so the asyncio rows then count only asyncio's Python helpers (timeouts,
locks, tasks' wrappers). The default, asyncio, is the loop the earlier figures were counted on.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

from inferq.api.app import create_app
from inferq.redis_server import RedisServer
from inferq.shared import keys
from inferq.shared.redis_clients import worker_client
from inferq.shared.settings import Settings
from inferq.worker.build import WorkerPlan, build_worker
from inferq.worker.models.echo import EchoModel

ROOT = Path(__file__).resolve().parents[1]


class Calls:
    """Function calls by (file, qualified name), on every thread, while `on` is set."""

    def __init__(self) -> None:
        self.on = False
        self.by: Counter[tuple[str, str]] = Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.on and event == "call":
            code = frame.f_code
            if code.co_filename != __file__:  # the driver's own `infer`, `receive`, `send`
                self.by[(code.co_filename, code.co_qualname)] += 1


def package(filename: str) -> str:
    """The package a file belongs to: inferq's api/worker/shared, else the installed
    distribution's top-level name (or the standard library module's)."""
    path = Path(filename)
    parts = path.parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    if path.is_relative_to(ROOT):
        return f"inferq {path.relative_to(ROOT).parts[0]}"
    for i, part in enumerate(parts):
        if part.startswith("python3"):  # the standard library: its top module
            return parts[i + 1].removesuffix(".py") if i + 1 < len(parts) else part
    return filename  # <string>, <frozen ...>


async def infer(app: Any, body: bytes) -> int:
    """One POST /v1/infer through the ASGI app; its status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/infer",
        "raw_path": b"/v1/infer",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"api")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect: the request waits for its answer
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def main(clients: int, requests: int, top: int, inputs: int = 1) -> Counter[tuple[str, str]]:
    calls = Calls()
    with tempfile.TemporaryDirectory() as d, RedisServer(Path(d)) as server:
        settings = Settings(_env_file=None, redis_url=server.url, model="echo", device="cpu")
        redis = worker_client(server.url, block_ms=settings.read_block_ms)
        worker = build_worker(settings, EchoModel(), "echo", redis, WorkerPlan(device="cpu"))
        running = asyncio.create_task(worker.run())
        app = create_app(settings)
        text = "the path of one request"
        asked = {"input": text} if inputs == 1 else {"inputs": [text] * inputs}
        body = orjson.dumps(asked | {"wait": 10})
        try:
            async with app.router.lifespan_context(app):
                # Its first heartbeat, in Redis (no event to await across the two sides).
                async with asyncio.timeout(30):
                    while not await redis.exists(keys.worker(worker.consumer)):  # noqa: ASYNC110
                        await asyncio.sleep(0.05)

                async def client() -> None:
                    for _ in range(requests):
                        status = await infer(app, body)
                        if status != 200:
                            raise RuntimeError(f"POST /v1/infer answered {status}")

                await asyncio.gather(*(client() for _ in range(clients)))  # warm: lazy set-ups
                threading.setprofile(calls)  # the model's and the prepare threads
                sys.setprofile(calls)
                calls.on = True
                await asyncio.gather(*(client() for _ in range(clients)))
                calls.on = False
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
            worker.stop()
            await asyncio.wait_for(running, 30)
            await redis.aclose()
    n = clients * requests
    by_package: Counter[str] = Counter()
    for (filename, _), count in calls.by.items():
        by_package[package(filename)] += count
    print(
        f"{sum(calls.by.values()) / n:.0f} Python calls a request ({clients} clients, {n} requests)"
    )
    print("\ncalls a request, by package:")
    for name, count in by_package.most_common():
        if count / n >= 0.5:
            print(f"{count / n:8.1f}  {name}")
    print(f"\nthe {top} most called functions, a request:")
    for (filename, qualname), count in calls.by.most_common(top):
        print(f"{count / n:8.2f}  {package(filename)}: {Path(filename).name}:{qualname}")
    return calls.by


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=40, help="each client's, in a row")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--inputs", type=int, default=1, help="inputs a request")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    run = main(args.clients, args.requests, args.top, args.inputs)
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(run)
    else:
        asyncio.run(run)
