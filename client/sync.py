"""`Client`: the blocking client, a driver of the flows in `inferq.client.flows`.

`map` runs its calls on a thread pool. Why threads and not the async client in a loop: a
thread pool reuses this very client (its connection pool, and the transport it was given: a
sync `httpx.MockTransport` or a custom `httpx.HTTPTransport` cannot serve an AsyncClient), and
it works where an event loop already runs (Jupyter, an async app calling sync code), where
`asyncio.run` refuses to start. The calls spend their time waiting on the network, so the GIL
costs nothing here. httpx's `Client` is safe to share between threads.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
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


class Client:
    """A blocking inferq client: retries, idempotency keys, long-polls and typed results.

    Job records come as msgpack with packed arrays (`compact`, the default: `Accept:
    application/msgpack, application/json`), decoded to the same `Job`s as JSON would give;
    `compact=False` asks for JSON. `transport` replaces httpx's network transport (tests pass an `httpx.MockTransport`);
    `sleep`, `clock` and `rng` replace `time.sleep`, `time.monotonic` and the jitter's random
    source, so a test never really waits. Use it as a context manager, or call `close()`.
    """

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
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._flows = Flows(
            retry or RetryPolicy(), long_poll_s=long_poll_s, clock=clock, rng=rng or random.Random()
        )
        self._http = httpx.Client(
            **http_options(base_url, api_key, timeout, headers, compact), transport=transport
        )
        self._sleep = sleep

    def _run(self, flow: Generator[Step, Outcome, T]) -> T:
        outcome: Outcome = None
        try:
            while True:
                outcome = self._step(flow.send(outcome))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _step(self, step: Step) -> Outcome:
        if isinstance(step, Sleep):
            self._sleep(step.seconds)
            return None
        try:
            return Reply.of(self._http.send(step.request(self._http)))
        except httpx.RequestError as e:  # handed to the flow: its retry policy decides
            return e

    def submit(
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
        return self._run(self._flows.submit(body, idempotency_key))

    def get(self, job_id: str, *, wait_s: float = 0.0) -> Job:
        """The job as it is now; with `wait_s`, one long-poll (answers once final)."""
        return self._run(self._flows.get(job_id, wait_s))

    def wait(self, job_id: str, timeout_s: float | None = None) -> Job:
        """Long-poll until final: the succeeded job; `JobFailed` if it ended otherwise,
        `WaitTimeout` if still not final after `timeout_s` (None: `DEFAULT_WAIT_S`, 300 s;
        `math.inf` waits without a bound)."""
        return self._run(self._flows.wait(job_id, timeout_s))

    def jobs(
        self,
        *,
        status: str | None = None,
        model: str | None = None,
        metadata: Mapping[str, str] | None = None,
        created_after: int | None = None,
        created_before: int | None = None,
        include_outputs: bool = False,
        page_size: int = 100,
    ) -> Iterator[Job]:
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
            jobs, more, after = self._run(self._flows.list_page(params))
            yield from jobs
            if not more or after is None:
                return

    def cancel(self, job_id: str) -> Job:
        """Cancel a job that has not ended (a running one ends `cancelled` at its worker's
        next batch: `cancel_requested` until then); `Conflict` if it had."""
        return self._run(self._flows.cancel(job_id))

    def infer(
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
        return self._run(self._flows.infer(body, idempotency_key))

    def embed(
        self,
        texts: str | Sequence[str],
        model: str | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> np.ndarray:
        """Embeddings (POST /v1/embeddings, base64): a float32 array, one row per text."""
        body = embeddings_body(texts, model, self._flows.long_poll_s)
        return self._run(self._flows.embed(body, idempotency_key))

    def map(
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
        input order. The first failure (in input order) is raised; calls not started by
        then are dropped, running ones finish."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        options: dict[str, Any] = dict(
            model=model, priority=priority, timeout_s=timeout_s, parameters=parameters
        )
        with ThreadPoolExecutor(concurrency, thread_name_prefix="inferq-map") as pool:
            futures = [pool.submit(self.infer, input=item, **options) for item in inputs]
            try:
                return [f.result() for f in futures]
            finally:
                for f in futures:
                    f.cancel()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
