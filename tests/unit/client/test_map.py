"""`map`: one job per input, results in input order, never more than `concurrency` calls in
flight (and exactly that many when there is work), the first failure raised."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from inferq.client import BadRequest
from tests.unit.client.fakes import FakeAPI, FakeClock, async_client, client, error, job, reply

CONCURRENCY = 4
TEXTS = [f"text {i}" for i in range(3 * CONCURRENCY)]


class InFlight:
    """Counts requests being answered at once, and the most there ever were."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


def _answer(request: httpx.Request) -> httpx.Response:
    text = json.loads(request.content)["input"]
    if text == "bad":
        return error(422, "invalid_input", "input 0 is empty")
    return reply(200, job(f"id-{text}", outputs=[[float(len(text))]]))


def test_sync_map_keeps_input_order_and_its_concurrency_bound() -> None:
    flight = InFlight()
    # Every `CONCURRENCY` calls wait for each other here: proof that that many run at once.
    barrier = threading.Barrier(CONCURRENCY, timeout=10)

    def handler(request: httpx.Request) -> httpx.Response:
        flight.enter()
        try:
            index = barrier.wait()
            time.sleep(0.002 * index)  # finish in another order than they started
            return _answer(request)
        finally:
            flight.leave()

    api = FakeAPI(handler=handler)
    with client(api, FakeClock()) as c:
        jobs = c.map(TEXTS, concurrency=CONCURRENCY, model="echo")
    assert [j.id for j in jobs] == [f"id-{t}" for t in TEXTS]
    assert flight.most == CONCURRENCY
    assert len({s.key for s in api.seen}) == len(TEXTS)  # one logical call, one key, per input
    assert all(s.body["model"] == "echo" for s in api.seen)


async def test_async_map_keeps_input_order_and_its_concurrency_bound() -> None:
    flight = InFlight()
    barrier = asyncio.Barrier(CONCURRENCY)

    async def handler(request: httpx.Request) -> httpx.Response:
        flight.enter()
        try:
            index = await asyncio.wait_for(barrier.wait(), 10)
            await asyncio.sleep(0.002 * index)
            return _answer(request)
        finally:
            flight.leave()

    api = FakeAPI(handler=handler)
    async with async_client(api, FakeClock()) as c:
        jobs = await c.map(TEXTS, concurrency=CONCURRENCY)
    assert [j.id for j in jobs] == [f"id-{t}" for t in TEXTS]
    assert flight.most == CONCURRENCY
    assert len({s.key for s in api.seen}) == len(TEXTS)


def test_sync_map_raises_the_first_failure() -> None:
    api = FakeAPI(handler=_answer)
    with client(api, FakeClock()) as c, pytest.raises(BadRequest):
        c.map(["a", "bad", "c"], concurrency=1)


async def test_async_map_raises_the_first_failure_and_leaves_no_task_behind() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["input"] != "bad":
            await asyncio.sleep(10)  # still running when the failure comes: cancelled
        return _answer(request)

    before = len(asyncio.all_tasks())
    async with async_client(FakeAPI(handler=handler), FakeClock()) as c:
        with pytest.raises(BadRequest):
            await asyncio.wait_for(c.map(["a", "bad", "c"], concurrency=3), 5)
    assert len(asyncio.all_tasks()) == before


async def test_map_refuses_a_concurrency_below_one() -> None:
    with client(FakeAPI(), FakeClock()) as c, pytest.raises(ValueError):
        c.map(["a"], concurrency=0)
    async with async_client(FakeAPI(), FakeClock()) as ac:
        with pytest.raises(ValueError):
            await ac.map(["a"], concurrency=0)
