"""`AsyncClient`: the asyncio client, a driver of the flows in `inferq.client.flows` (the
same flows as `Client`, so the two behave the same request for request).

`map` bounds its calls with a semaphore: every input gets a task, at most `concurrency` of
them are inside `infer` at once.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any, TypeVar

import httpx
import numpy as np

from inferq.client.flows import Flows, Outcome, Step
from inferq.client.jobs import Job
from inferq.client.retry import RetryPolicy
from inferq.client.wire import (
    Item,
    Priority,
    Reply,
    Sleep,
    embeddings_body,
    http_options,
    job_body,
    list_params,
)

T = TypeVar("T")


class AsyncClient:
    """The asyncio twin of `Client`: the same constructor (with an async `transport` and an
    awaitable `sleep`) and the same methods, awaited. Use `async with`, or `await aclose()`."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 30.0,
        retry: RetryPolicy | None = None,
        long_poll_s: float = 30.0,
        headers: Mapping[str, str] | None = None,
        compact: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._flows = Flows(
            retry or RetryPolicy(), long_poll_s=long_poll_s, clock=clock, rng=rng or random.Random()
        )
        self._http = httpx.AsyncClient(
            **http_options(base_url, api_key, timeout, headers, compact), transport=transport
        )
        self._sleep = sleep

    async def _run(self, flow: Generator[Step, Outcome, T]) -> T:
        outcome: Outcome = None
        try:
            while True:
                outcome = await self._step(flow.send(outcome))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _step(self, step: Step) -> Outcome:
        if isinstance(step, Sleep):
            await self._sleep(step.seconds)
            return None
        try:
            return Reply.of(await self._http.send(step.request(self._http)))
        except httpx.RequestError as e:  # handed to the flow: its retry policy decides
            return e

    async def submit(
        self,
        inputs: Sequence[Item] | None = None,
        *,
        input: Item | None = None,
        model: str | None = None,
        priority: Priority | None = None,
        timeout_s: float | None = None,
        parameters: Mapping[str, Any] | None = None,
        webhook: str | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, str] | None = None,
        result_ttl_s: int | None = None,
    ) -> Job:
        """Queue a job (POST /v1/jobs); returns it queued. Exactly one of `inputs`, `input`."""
        body = job_body(
            inputs,
            input,
            model=model,
            priority=priority,
            timeout_s=timeout_s,
            parameters=parameters,
            webhook=webhook,
            metadata=metadata,
            result_ttl_s=result_ttl_s,
        )
        return await self._run(self._flows.submit(body, idempotency_key))

    async def get(self, job_id: str, *, wait_s: float = 0.0) -> Job:
        """The job as it is now; with `wait_s`, one long-poll (answers once final)."""
        return await self._run(self._flows.get(job_id, wait_s))

    async def wait(self, job_id: str, timeout_s: float | None = None) -> Job:
        """Long-poll until final: the succeeded job; `JobFailed` if it ended otherwise,
        `WaitTimeout` if still not final after `timeout_s` (None: `DEFAULT_WAIT_S`, 300 s;
        `math.inf` waits without a bound)."""
        return await self._run(self._flows.wait(job_id, timeout_s))

    async def jobs(
        self,
        *,
        status: str | None = None,
        model: str | None = None,
        metadata: Mapping[str, str] | None = None,
        created_after: int | None = None,
        created_before: int | None = None,
        include_outputs: bool = False,
        page_size: int = 100,
    ) -> AsyncIterator[Job]:
        """Your jobs, newest first (GET /v1/jobs), fetched a page at a time as you iterate:
        filtered by status, model, labels (all must match) and creation time (Unix s)."""
        after: str | None = None
        while True:
            params = list_params(
                limit=page_size,
                after=after,
                status=status,
                model=model,
                metadata=metadata,
                created_after=created_after,
                created_before=created_before,
                include_outputs=include_outputs,
            )
            jobs, more, after = await self._run(self._flows.list_page(params))
            for job in jobs:
                yield job
            if not more or after is None:
                return

    async def cancel(self, job_id: str) -> Job:
        """Cancel a job that has not ended (a running one ends `cancelled` at its worker's
        next batch: `cancel_requested` until then); `Conflict` if it had."""
        return await self._run(self._flows.cancel(job_id))

    async def infer(
        self,
        inputs: Sequence[Item] | None = None,
        *,
        input: Item | None = None,
        model: str | None = None,
        priority: Priority | None = None,
        timeout_s: float | None = None,
        parameters: Mapping[str, Any] | None = None,
        webhook: str | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, str] | None = None,
        result_ttl_s: int | None = None,
    ) -> Job:
        """Submit and wait (POST /v1/infer, then long-polls): the succeeded job, or
        `JobFailed`. The wait is bounded: by the job's deadline `timeout_s` plus 30 s, or
        without one by `DEFAULT_WAIT_S` (300 s); then `WaitTimeout`, its job still running."""
        body = job_body(
            inputs,
            input,
            model=model,
            priority=priority,
            timeout_s=timeout_s,
            parameters=parameters,
            webhook=webhook,
            metadata=metadata,
            result_ttl_s=result_ttl_s,
        )
        return await self._run(self._flows.infer(body, idempotency_key))

    async def embed(
        self,
        texts: str | Sequence[str],
        model: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> np.ndarray:
        """Embeddings (POST /v1/embeddings, base64): a float32 array, one row per text."""
        body = embeddings_body(texts, model, self._flows.long_poll_s)
        return await self._run(self._flows.embed(body, idempotency_key))

    async def map(
        self,
        inputs: Iterable[Item],
        *,
        concurrency: int = 8,
        model: str | None = None,
        priority: Priority | None = None,
        timeout_s: float | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> list[Job]:
        """`infer` each input as its own job, at most `concurrency` at a time; the jobs in
        input order. The first failure is raised and the calls still running are cancelled
        (a job no worker has taken yet is then cancelled by the API too)."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        gate = asyncio.Semaphore(concurrency)
        options: dict[str, Any] = dict(
            model=model, priority=priority, timeout_s=timeout_s, parameters=parameters
        )

        async def one(item: Item) -> Job:
            async with gate:
                return await self.infer(input=item, **options)

        tasks = [asyncio.ensure_future(one(item)) for item in inputs]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            # Let the cancelled ones finish unwinding before returning: no task left behind.
            await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
