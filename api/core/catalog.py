"""What the API knows of the models it serves: their names, what each takes (as its workers
declared it in Redis) and how fast its workers go, each read from Redis at most every few
seconds per process, and by one request at a time: the requests that find the value stale
while it is being read wait for that read (at 512 clients, every request arriving during one
read's round trip used to read it again: ~14 % of the API's CPU)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from inferq.shared.errors import InputInvalid, ModelNotServed
from inferq.shared.jobs import now_ms
from inferq.shared.registry import ModelInfo, WorkerRegistry
from inferq.shared.schema import InputKind
from inferq.shared.settings import Settings

# Worker throughput and model declarations are read from Redis at most this often per model.
THROUGHPUT_TTL_S = 1.0
INFO_TTL_S = 5.0

T = TypeVar("T")


class SingleFlight:
    """One read per key at a time: a caller that comes while one runs awaits that one."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[Any]] = {}

    async def run(self, key: str, read: Callable[[], Awaitable[T]]) -> T:
        running = self._running.get(key)
        if running is None:
            running = asyncio.ensure_future(read())
            self._running[key] = running
            running.add_done_callback(lambda _, k=key: self._running.pop(k, None))  # type: ignore[misc]
        # Shielded: a caller that leaves (its client gone) does not cancel the others' read.
        return await asyncio.shield(running)  # type: ignore[no-any-return]


class ModelCatalog:
    def __init__(self, settings: Settings, registry: WorkerRegistry) -> None:
        self.default = settings.default_model.name
        self.names = settings.served_models
        self.registry = registry
        self._throughput: dict[str, tuple[float, float]] = {}  # model → (read at, items/s)
        self._info: dict[str, tuple[float, ModelInfo | None]] = {}  # model → (read at, info)
        self._reads = SingleFlight()

    def resolve(self, requested: str | None) -> str:
        """The served model a request names (the default when it names none); 404 if the
        name is not served here (the message shows at most 64 of its characters)."""
        name = requested or self.default
        if name not in self.names:
            served = ", ".join(sorted(self.names))
            raise ModelNotServed(f"model {name[:64]!r} is not served here; served: {served}")
        return name

    async def throughput(self, model: str) -> float:
        """Recent items/s of the model's live workers (cached briefly per process)."""
        now = time.monotonic()
        cached = self._throughput.get(model)
        if cached is not None and now - cached[0] < THROUGHPUT_TTL_S:
            return cached[1]
        value = await self._reads.run(
            f"throughput:{model}", lambda: self.registry.throughput(model, now_ms())
        )
        self._throughput[model] = (now, value)
        return value

    async def info(self, model: str) -> ModelInfo | None:
        """What `model` takes, as its workers declared it (None until one has started)."""
        now = time.monotonic()
        cached = self._info.get(model)
        if cached is not None and now - cached[0] < INFO_TTL_S:
            return cached[1]
        info = await self._reads.run(f"info:{model}", lambda: self.registry.model_info(model))
        if info is not None:  # not yet declared: look again next time, not in INFO_TTL_S
            self._info[model] = (now, info)
        return info

    async def check(self, model: str, kinds: list[InputKind], parameters: dict[str, Any]) -> None:
        """Inputs of a kind the model does not take, or parameters it does not know → 422."""
        info = await self.info(model)
        if info is None:
            return  # no worker has declared it yet: the worker checks (invalid_input)
        for i, kind in enumerate(kinds):
            if kind not in info.inputs:
                raise InputInvalid(
                    f"input {i} is {kind}, but model {model!r} takes {', '.join(info.inputs)}"
                )
        if unknown := sorted(set(parameters) - set(info.parameters)):
            takes = ", ".join(sorted(info.parameters)) or "none"
            shown = [u[:64] for u in unknown[:8]]
            raise InputInvalid(f"unknown parameters {shown} for model {model!r}; it takes: {takes}")
