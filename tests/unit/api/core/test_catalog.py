"""`ModelCatalog`: throughput and model declarations are read once per TTL and by one request
at a time, however many requests find them stale together (a fake registry that counts its
reads and answers when the test lets it)."""

from __future__ import annotations

import asyncio

import pytest

from inferq.api.core import admission as catalog_module
from inferq.api.core.admission import ModelCatalog
from inferq.shared.errors import QueueUnavailable
from inferq.shared.registry import ModelInfo
from inferq.shared.settings import Settings

INFO = ModelInfo(inputs=("text",), output="vector", parameters={})


class SlowRegistry:
    def __init__(self) -> None:
        self.reads = {"throughput": 0, "info": 0}
        self.go = asyncio.Event()
        self.fail = False

    async def throughput(self, model: str, now_ms: int) -> float:
        self.reads["throughput"] += 1
        await self.go.wait()
        if self.fail:
            raise QueueUnavailable("redis unavailable: test")
        return 42.0

    async def model_info(self, model: str) -> ModelInfo | None:
        self.reads["info"] += 1
        await self.go.wait()
        return INFO


def _catalog(registry: SlowRegistry) -> ModelCatalog:
    return ModelCatalog(Settings(_env_file=None, model="echo"), registry)  # type: ignore[arg-type]


async def test_many_stale_callers_share_one_read() -> None:
    registry = SlowRegistry()
    catalog = _catalog(registry)
    callers = [asyncio.create_task(catalog.throughput("echo")) for _ in range(200)]
    infos = [asyncio.create_task(catalog.info("echo")) for _ in range(50)]
    await asyncio.sleep(0)
    registry.go.set()
    assert await asyncio.gather(*callers) == [42.0] * 200
    assert await asyncio.gather(*infos) == [INFO] * 50
    assert registry.reads == {"throughput": 1, "info": 1}
    assert await catalog.throughput("echo") == 42.0  # cached: no read
    assert registry.reads["throughput"] == 1


async def test_a_failed_read_reaches_every_waiter_and_the_next_call_reads_again() -> None:
    registry = SlowRegistry()
    registry.fail = True
    catalog = _catalog(registry)
    callers = [asyncio.create_task(catalog.throughput("echo")) for _ in range(10)]
    await asyncio.sleep(0)
    registry.go.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(r, QueueUnavailable) for r in results)
    assert registry.reads["throughput"] == 1
    registry.fail = False
    assert await catalog.throughput("echo") == 42.0 and registry.reads["throughput"] == 2


async def test_a_caller_that_leaves_does_not_cancel_the_others_read() -> None:
    registry = SlowRegistry()
    catalog = _catalog(registry)
    leaving = asyncio.create_task(catalog.throughput("echo"))
    staying = asyncio.create_task(catalog.throughput("echo"))
    await asyncio.sleep(0)
    leaving.cancel()
    registry.go.set()
    assert await staying == 42.0
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert registry.reads["throughput"] == 1


async def test_a_stale_value_is_read_again_after_its_ttl() -> None:
    registry = SlowRegistry()
    registry.go.set()
    catalog = _catalog(registry)
    await catalog.throughput("echo")
    await catalog.throughput("echo")
    assert registry.reads["throughput"] == 1
    read_at, value = catalog._throughput["echo"]  # age the entry past its TTL
    catalog._throughput["echo"] = (read_at - catalog_module.THROUGHPUT_TTL_S, value)
    await catalog.throughput("echo")
    assert registry.reads["throughput"] == 2
