"""The worker in this process, against the session's real Redis: models a test can steer,
a clock it can move, and a TCP proxy it can cut to make Redis disappear for the worker only.

Everything here waits on conditions with deadlines; nothing sleeps and hopes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.jobs import Job, new_job_id
from inferq.shared.redis_clients import worker_client
from inferq.shared.settings import Settings
from inferq.worker.build import WorkerPlan, build_worker
from inferq.worker.models.base import DeviceOutOfMemory
from inferq.worker.models.echo import EchoModel
from inferq.worker.runtime import Worker
from tests.queues import JobQueue


async def until(cond: Callable[[], Awaitable[Any] | Any], timeout_s: float, what: str) -> Any:
    """Await `cond` (sync or async) until truthy; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)


class FakeClock:
    """Monotonic and wall time that move only when the test says so."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.wall_ms = int(time.time() * 1000)

    def monotonic(self) -> float:
        return self.t

    def now_ms(self) -> int:
        return self.wall_ms

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.wall_ms += int(seconds * 1000)


class Recorder(EchoModel):
    """echo that records every batch it is asked to run (texts, in order) and can be steered:
    a batch holding 'boom' raises; one over `oom_over` padded words runs out of memory; while
    `gate` is clear, batches wait on it (held on the "device")."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []
        self.oom_over: int | None = None
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set when a batch reached run()

    def run(self, batch: list[Any]) -> np.ndarray:
        self.batches.append(list(batch))
        self.entered.set()
        self.gate.wait(30)
        padded = len(batch) * max(max(1, len(t.split())) for t in batch)
        if self.oom_over is not None and padded > self.oom_over:
            raise DeviceOutOfMemory(f"test OOM at {padded} > {self.oom_over}")
        if any("boom" in t for t in batch):
            raise RuntimeError("boom in batch")
        return super().run(batch)

    def ran(self, text: str) -> list[list[str]]:
        return [b for b in self.batches if text in b]


class InProcess:
    """One `Worker` running as a task of the test's event loop."""

    def __init__(
        self,
        url: str,
        model: Recorder,
        clock: FakeClock | None = None,
        worker_url: str | None = None,  # e.g. a Proxy's, to cut Redis off for the worker only
        **settings: Any,
    ) -> None:
        defaults = dict(
            redis_url=worker_url or url,
            model="echo",
            device="cpu",
            read_block_ms=100,
            heartbeat_s=0.2,
            worker_id="inproc",
            max_wait_ms=0,
        )
        self.settings = Settings(_env_file=None, **(defaults | settings))  # type: ignore[arg-type]
        self.model = model
        self.clock = clock
        self.redis = worker_client(
            worker_url or url,
            block_ms=self.settings.read_block_ms,
            multiplex=self.settings.redis_multiplex,  # as `worker.main.serve` builds it
        )
        self.admin = Redis.from_url(url)  # the test's own view of Redis
        self.queue = JobQueue(self.admin, result_ttl_s=60)
        self.worker: Worker | None = None
        self.task: asyncio.Task[bool] | None = None

    async def submit(
        self, *texts: str, priority: str = "normal", attempts: int = 0, deadline_ms: int = 0
    ) -> str:
        """A job as the API would submit it; `attempts` > 0 makes it a suspect."""
        job = Job(
            id=new_job_id("echo"),
            model="echo",
            inputs=list(texts),
            priority=priority,
            attempts=attempts,
            deadline_ms=deadline_ms,
        )
        assert (await self.queue.submit(job)).outcome == "created"
        return job.id

    async def start(self) -> Worker:
        self.worker = build_worker(
            self.settings,
            self.model,
            "echo",
            self.redis,
            WorkerPlan(device="cpu"),
            clock=self.clock,  # type: ignore[arg-type]
        )
        self.task = asyncio.create_task(self.worker.run())
        await until(lambda: self.admin.exists(keys.worker("inproc")), 10, "the first heartbeat")
        return self.worker

    async def final(self, job_id: str, timeout_s: float = 10) -> Job:
        async def done() -> Job | None:
            job = await self.queue.get(job_id)
            return job if job is not None and job.status.is_final else None

        return await until(done, timeout_s, f"job {job_id} to be final")  # type: ignore[no-any-return]

    async def stop(self, timeout_s: float = 20) -> bool:
        assert self.worker is not None and self.task is not None
        self.worker.stop()
        return await asyncio.wait_for(self.task, timeout_s)

    async def close(self) -> None:
        self.model.gate.set()
        if self.task is not None and not self.task.done():
            with contextlib.suppress(Exception):
                await self.stop()
        await self.redis.aclose()
        await self.admin.aclose()


class Proxy:
    """A TCP forwarder to Redis that can be cut (every connection dropped, new ones refused)
    and restored, so a worker behind it sees a Redis outage while the test's client does not."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._conns |= {writer, up_w}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        self._conns -= {writer, up_w}

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for w in list(self._conns):
            w.close()
        self._conns.clear()

    async def restore(self) -> None:
        await self.start()  # same port

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.cut()
