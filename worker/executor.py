"""Runs batches on the device: the model threads, the OOM mapping, the bisection.

`Executor.run(items, sink)` gives every item exactly one outcome through `sink`: its output
(`on_rows`), or its failure (`on_failure`). A batch that fails is split in two and each half
retried, until the guilty item is alone (`model_error`); a batch that runs out of memory
(`is_oom`: any model's allocation failure, mapped or not) frees the cache, lowers the live
ceiling (`Scheduler.on_oom`) and is split the same way, and an item that cannot fit alone
fails its own job (`too_large`). Items whose job already ended (`sink.live`) never run.

The model runs in the executor's own threads (one per batch allowed in flight), so the event
loop, the heartbeat and the publishing stay live during device work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from inferq.shared.jobs import ErrorCode, Job, JobError
from inferq.worker.book import JobState, Work, work
from inferq.worker.models.base import Model, ModelError, Prepared, is_oom
from inferq.worker.policy.scheduler import Item, padded_cost

log = logging.getLogger("inferq.worker")


class Sink(Protocol):
    """Where the executor's outcomes go (the worker's book of held jobs)."""

    def live_items(self, items: list[Item]) -> list[Item]:
        """`items` whose job has not ended."""

    def on_rows(
        self, items: list[Item], outputs: Sequence[Any] | np.ndarray, padded: int, run_s: float
    ) -> None:
        """`outputs[i]` belongs to `items[i]`."""

    def on_failure(self, item: Item, error: JobError) -> None: ...

    def on_oom(self, items: list[Item], padded: int, before: int, after: int) -> None: ...

    def on_split(self, items: list[Item]) -> None: ...


def release_device_cache(device: str) -> None:
    """After an OOM only: hand cached blocks back so the retry sees the memory."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def _outputs(out: Any, n: int) -> Sequence[Any] | np.ndarray:
    """One output per item, or ModelError saying how to fix the model."""
    if isinstance(out, np.ndarray):
        if out.ndim == 0 or out.shape[0] != n:
            raise ModelError(
                f"model returned an array of shape {out.shape} for {n} inputs: "
                "return one row (or one output) per input"
            )
        return out
    if not isinstance(out, list | tuple) or len(out) != n:
        got = f"{len(out)} outputs" if isinstance(out, list | tuple) else type(out).__name__
        raise ModelError(f"model returned {got} for {n} inputs: return one output per input")
    return out


class Sizing(Protocol):
    """What the executor needs of the scheduler: whether a batch still fits, how to split
    one, and what a success or an OOM does to the live ceiling."""

    def fits(self, items: list[Item]) -> bool: ...

    def split(self, items: list[Item]) -> tuple[list[Item], list[Item]]: ...

    def on_success(self, run_s: float) -> int | None: ...

    def on_oom(self, padded: int) -> tuple[int, int]: ...


class Executor:
    def __init__(self, model: Model, scheduler: Sizing, *, threads: int, device: str) -> None:
        self.model = model
        self.scheduler = scheduler
        self.device = device
        # bound: one thread per batch allowed in flight (1 on a GPU: a second would only
        # contend for the same device; on a CPU, one core per batch beats splitting ops).
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="inferq-model")

    def shutdown(self, *, wait: bool = True) -> None:
        """Release the model threads; `wait=False` when one may be stuck on the device."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)

    async def run(self, items: list[Item], sink: Sink) -> None:
        items = sink.live_items(items)
        if not items:
            return
        padded = padded_cost(items)
        if not self.scheduler.fits(items):
            await self._split(items, sink)  # the ceiling dropped since this batch was packed
            return
        t0 = time.perf_counter()
        try:
            out = await asyncio.get_running_loop().run_in_executor(
                self._pool,
                self.model.run,
                [it.key.payload for it in items],  # `Work`s
            )
            outputs = _outputs(out, len(items))
        except Exception as e:
            await self._failed(items, padded, e, sink)
            return
        self._succeeded(items, outputs, padded, time.perf_counter() - t0, sink)

    def _succeeded(
        self,
        items: list[Item],
        outputs: Sequence[Any] | np.ndarray,
        padded: int,
        run_s: float,
        sink: Sink,
    ) -> None:
        raised = self.scheduler.on_success(run_s)
        if raised is not None:
            log.info("live ceiling raised to %d after successful batches", raised)
        sink.on_rows(items, outputs, padded, run_s)

    async def _failed(self, items: list[Item], padded: int, e: Exception, sink: Sink) -> None:
        """A batch raised: an OOM lowers the ceiling and splits; a lone item fails its job;
        a larger batch is split until the bad item is alone."""
        if is_oom(e):
            await self._on_oom(items, padded, e, sink)
        elif len(items) == 1:
            log.warning(
                "job %s failed: model error on item %d: %r",
                work(items[0]).state.job.id,
                work(items[0]).index,
                e,
            )
            sink.on_failure(items[0], JobError(ErrorCode.MODEL_ERROR, f"{type(e).__name__}: {e}"))
        else:
            log.info(
                "batch of %d failed (%s); splitting to isolate the bad item",
                len(items),
                type(e).__name__,
            )
            await self._split(items, sink)

    async def run_alone(
        self,
        state: JobState,
        prepare: Callable[[Job], list[Prepared] | JobError],
        sink: Sink,
        arrived: float,
    ) -> None:
        """An idle worker's lone one-input job: prepared and run in one hop to a model thread
        (not a prepare thread, the event loop, then a model thread), with the same outcomes
        as `run` would give it."""

        def both() -> tuple[list[Prepared] | JobError, Any, Exception | None, float]:
            prepared = prepare(state.job)
            if isinstance(prepared, JobError):
                return prepared, None, None, 0.0
            t0 = time.perf_counter()
            try:
                out = self.model.run([prepared[0].payload])
            except Exception as e:  # handled on the loop, exactly as for any batch
                return prepared, None, e, 0.0
            return prepared, out, None, time.perf_counter() - t0

        loop = asyncio.get_running_loop()
        prepared, out, error, run_s = await loop.run_in_executor(self._pool, both)
        if isinstance(prepared, JobError):
            sink.on_failure(Item(Work(state, 0, None), cost=1, arrived=arrived), prepared)
            return
        items = [Item(Work(state, 0, prepared[0].payload), cost=prepared[0].cost, arrived=arrived)]
        if error is None:
            try:
                outputs = _outputs(out, 1)
            except ModelError as e:
                error = e
        if error is not None:
            await self._failed(items, items[0].cost, error, sink)
            return
        self._succeeded(items, outputs, items[0].cost, run_s, sink)

    async def _split(self, items: list[Item], sink: Sink) -> None:
        sink.on_split(items)
        for half in self.scheduler.split(items):
            await self.run(half, sink)

    async def _on_oom(self, items: list[Item], padded: int, e: Exception, sink: Sink) -> None:
        release_device_cache(self.device)
        before, after = self.scheduler.on_oom(padded)
        log.warning(
            "out of memory at items=%d cost=%d (%s); live ceiling %d -> %d",
            len(items),
            padded,
            e,
            before,
            after,
        )
        sink.on_oom(items, padded, before, after)
        if len(items) == 1:
            message = (
                f"input {work(items[0]).index} (cost {padded}) does not fit in device memory alone"
            )
            sink.on_failure(items[0], JobError(ErrorCode.TOO_LARGE, message))
            return
        await self._split(items, sink)
