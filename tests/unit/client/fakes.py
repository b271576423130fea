"""A scripted API behind `httpx.MockTransport` and a fake clock: the client's unit tests run
with no socket and never really sleep."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from inferq.client import AsyncClient, Client, RetryPolicy

BASE = "http://inferq.test"
# A response, an exception to raise as a transport would, or (async handlers) a coroutine.
Answer = Any
Handler = Callable[[httpx.Request], Answer]


@dataclass
class Seen:
    """One request as the fake server saw it."""

    method: str
    path: str
    params: dict[str, str]
    body: Any
    headers: httpx.Headers
    raw_path: bytes = b""

    @property
    def key(self) -> str | None:
        return self.headers.get("idempotency-key")


def job(job_id: str = "j1", status: str = "succeeded", **fields: Any) -> dict[str, Any]:
    """A job view as the API answers it."""
    return {"id": job_id, "model": "echo", "status": status, "timings": {}, **fields}


def reply(status: int, body: Any = None, **headers: str) -> httpx.Response:
    if body is None:
        return httpx.Response(status, headers=headers)
    return httpx.Response(status, json=body, headers=headers)


def error(status: int, code: str, message: str = "no", **headers: str) -> httpx.Response:
    return reply(status, {"error": {"code": code, "message": message}}, **headers)


@dataclass
class FakeAPI:
    """Answers requests from a script: a list of answers taken in order (an exception is
    raised, as a transport would), or a handler called for each request."""

    script: list[Answer] = field(default_factory=list)
    handler: Handler | None = None
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: httpx.Request) -> Any:
        content = request.read()
        with self.lock:
            self.seen.append(
                Seen(
                    request.method,
                    request.url.path,
                    dict(request.url.params),
                    json.loads(content) if content else None,
                    request.headers,
                    request.url.raw_path,
                )
            )
            scripted = None if self.handler else self.script.pop(0)
        # The handler runs outside the lock: concurrent calls must overlap in it.
        answer = self.handler(request) if self.handler else scripted
        if isinstance(answer, Exception):
            raise answer
        return answer

    def requests(self) -> list[tuple[str, str]]:
        return [(s.method, s.path) for s in self.seen]


@dataclass
class FakeClock:
    """Monotonic time that moves only when the client sleeps; every sleep recorded."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


def fast_retry(**overrides: Any) -> RetryPolicy:
    return RetryPolicy(**{"attempts": 5, "base_s": 0.5, "cap_s": 8.0, **overrides})


def client(api: FakeAPI, clock: FakeClock, **options: Any) -> Client:
    options.setdefault("retry", fast_retry())
    options.setdefault("rng", random.Random(1))
    return Client(
        BASE, transport=httpx.MockTransport(api), sleep=clock.sleep, clock=clock, **options
    )


def async_client(api: FakeAPI, clock: FakeClock, **options: Any) -> AsyncClient:
    options.setdefault("retry", fast_retry())
    options.setdefault("rng", random.Random(1))
    return AsyncClient(
        BASE, transport=httpx.MockTransport(api), sleep=clock.asleep, clock=clock, **options
    )


def keys(seen: Iterable[Seen]) -> list[str | None]:
    return [s.key for s in seen]
