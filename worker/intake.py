"""Redis → held jobs: read, take over, claim, admit.

- read: our own pending entries first (delivered before a crash or reconnect: a `>` read
  never returns them again, so they would wait for a take-over), then new ones; with a
  backlog lane by lane (`inferq.worker.policy.lanes`), so priorities decide who gets into
  the batcher, else one blocking read over every lane; with several queue shards, over
  every shard (on a Redis Cluster, one read per shard: `shard_reads`);
- take over: on a schedule, claim the entries of consumers whose heartbeat is gone (with an
  idle guard, so two live workers never both win) and of any stuck past the visibility
  timeout;
- claim: mark the jobs running and read their records in one trip;
- admit: decide each job's fate before it costs device time: poisoned (on a device at
  `max_deliveries` worker deaths), expired, refused by the model's `prepare` (its own job
  fails, nothing else), or held, split into items. `prepare` runs in a thread of its own, so
  tokenising or decoding never holds up the event loop, unless its measured cost says the
  claim's inputs take less than a hop to that thread would (`policy.prepare`); the jobs of
  one claim are prepared in one call where the model can (`PreparesMany`: one tokenizer call
  for all their texts).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from inferq.shared.consumer import JobConsumer
from inferq.shared.jobs import (
    Clock,
    ErrorCode,
    Job,
    JobError,
    Status,
    decode_input,
    inputs_bytes,
)
from inferq.shared.queue import Entry
from inferq.shared.registry import WorkerRegistry
from inferq.shared.schema import LANES
from inferq.shared.settings import Settings
from inferq.worker.book import JobState, Work
from inferq.worker.models.base import (
    Input,
    InputKind,
    InvalidInput,
    Model,
    ModelError,
    Prepared,
    PreparesMany,
    Tensor,
)
from inferq.worker.policy.lanes import lane_order
from inferq.worker.policy.prepare import PrepareCost
from inferq.worker.policy.scheduler import Item
from inferq.worker.shard_reads import ShardReads

log = logging.getLogger("inferq.worker")


@dataclass(slots=True)
class Arrivals:
    """What one claim produced: jobs to hold, jobs already decided, entries to just ack."""

    held: list[tuple[JobState, list[Item]]] = field(default_factory=list)
    decided: list[tuple[JobState, JobError, Status]] = field(default_factory=list)
    stale: list[Entry] = field(default_factory=list)
    # An idle worker's lone one-input job, its start counted by the claim: not prepared
    # here, it is prepared and run in one hop to a model thread (`Worker._run_alone`).
    alone: tuple[Entry, Job] | None = None


def _checked(prepared: list[Prepared], n: int) -> list[Prepared]:
    if len(prepared) != n or any(
        isinstance(p.cost, bool) or not isinstance(p.cost, int) or p.cost < 1 for p in prepared
    ):
        raise ModelError("prepare() must return one item per input, each with an int cost >= 1")
    return prepared


class Intake:
    def __init__(
        self,
        queue: JobConsumer,
        registry: WorkerRegistry,
        model: Model,
        settings: Settings,
        *,
        model_name: str,
        consumer: str,
        clock: Clock,
    ) -> None:
        self.queue, self.registry, self.model, self.settings = queue, registry, model, settings
        self.model_name, self.consumer, self.clock = model_name, consumer, clock
        self.taken_over = 0
        self._pending = True  # start with our own PEL
        self._backlog = True  # until a read comes back short, assume work is waiting
        self._reads = 0
        self._next_takeover = 0.0
        # Which shards one XREADGROUP may name together: all of them on one Redis; one at a
        # time on a cluster (a read's streams must share a slot).
        n = queue.shards
        self._groups: list[tuple[int, ...]] = (
            [(s,) for s in range(n)] if queue.cluster else [tuple(range(n))]
        )
        self._blocking = ShardReads()
        # One thread: a job's inputs are prepared in order; the model has its own threads.
        self._prepare = ThreadPoolExecutor(1, thread_name_prefix="inferq-prepare")
        self._prepare_lock = threading.Lock()
        self.prepare_cost = PrepareCost()
        # The prepare's own CPU, not its wall time: in the thread, a wait for the GIL is
        # contention, not cost, and would keep every claim off the loop under load.
        self.prepare_timer: Callable[[], float] = time.thread_time

    def shutdown(self) -> None:
        self._prepare.shutdown(wait=True)

    def reconnected(self) -> None:
        """After a Redis failure: entries may have been delivered whose reply we lost."""
        self._pending = True

    async def fetch(self, room: int, known: Callable[[str], bool]) -> list[Entry]:
        """Up to `room` entries this worker does not hold yet (may block up to read_block_ms)."""
        if self.clock.monotonic() >= self._next_takeover:
            self._next_takeover = self.clock.monotonic() + min(
                1.0, self.settings.visibility_timeout_s / 3
            )
            taken = [e for e in await self._take_over() if not known(e.job_id)]
            if taken:
                self.taken_over += len(taken)
                return taken
        fresh = [e for e in await self._read(room) if not known(e.job_id)]
        if not self._pending:
            return fresh
        if not fresh:
            # Our PEL holds nothing we do not hold already: from now on, new entries. (What
            # we hold stays in it until acked: waiting for an empty read would re-read it,
            # without blocking, in a hot loop until every held job had finished.)
            self._pending = False
        return fresh[:room]  # the rest stays in our PEL for the next read

    async def _read(self, room: int) -> list[Entry]:
        count = min(room, self.settings.max_batch_size)
        read = self.queue.read
        # Shards in turn go first, so a busy shard never starves the others.
        turn = self._reads % len(self._groups)
        groups = self._groups[turn:] + self._groups[:turn]
        if self._pending:
            # The whole PEL in one read (what we may hold, plus a read whose reply was lost),
            # so the entries we hold cannot hide one we do not; anything past it sits idle,
            # and the take-over's visibility timeout claims it.
            whole = self.settings.prefetch_limit + count
            got: list[Entry] = []
            for g in groups:
                got += await read(
                    self.model_name,
                    self.consumer,
                    count=whole,
                    block_ms=None,
                    pending=True,
                    shards=g,
                )
            return got
        got = await self._read_backlog(groups, count) if self._backlog else []
        if not got:
            got = await self._read_blocking(groups, count)
        self._backlog = len(got) >= count
        return got

    async def _read_backlog(self, groups: list[tuple[int, ...]], count: int) -> list[Entry]:
        """With a backlog: lane by lane in priority order, without blocking, up to `count`."""
        got: list[Entry] = []
        for lane in lane_order(self._reads, LANES):
            for g in groups:
                got += await self.queue.read(
                    self.model_name,
                    self.consumer,
                    count=count - len(got),
                    block_ms=None,
                    lanes=(lane,),
                    shards=g,
                )
                if len(got) >= count:
                    break
            if len(got) >= count:
                break
        self._reads += 1
        return got

    async def _read_blocking(self, groups: list[tuple[int, ...]], count: int) -> list[Entry]:
        """No backlog: a blocking read over every lane answers as soon as anything arrives."""
        block_ms = self.settings.read_block_ms
        if len(groups) == 1:
            return await self.queue.read(
                self.model_name, self.consumer, count=count, block_ms=block_ms, shards=groups[0]
            )

        def one(shard: int) -> Awaitable[list[Entry]]:
            return self.queue.read(
                self.model_name, self.consumer, count=count, block_ms=block_ms, shards=(shard,)
            )

        return await self._blocking.next((g[0] for g in groups), one, block_ms / 1000 + 1)

    async def settle(self) -> list[Entry]:
        """At stop: the entries that blocking reads still in flight deliver (to hand back)."""
        return await self._blocking.settle()

    async def _take_over(self) -> list[Entry]:
        """Claim entries of consumers whose heartbeat is gone, and of any stuck past the timeout."""
        pending = await self.queue.consumers(self.model_name)
        others = [c for c, n in pending.items() if n and c != self.consumer]
        alive = await self.registry.alive(others)
        dead = [c for c, a in zip(others, alive, strict=True) if not a]
        # A dead worker's entries stopped being refreshed when it died; requiring half a
        # heartbeat TTL of idleness keeps two live workers from both claiming them.
        taken = await self.queue.take_over(
            self.model_name,
            self.consumer,
            dead=dead,
            dead_idle_ms=int(self.settings.heartbeat_ttl_s * 500),
            stuck_idle_ms=int(self.settings.visibility_timeout_s * 1000),
        )
        if taken:
            log.warning(
                "took over %d entries (dead consumers: %s)", len(taken), ", ".join(dead) or "none"
            )
        return taken

    async def admit(self, entries: list[Entry], *, idle: bool = False) -> Arrivals:
        """Claim `entries` and decide each job's fate (see the module docstring).

        `idle`: nothing is held or running, so a lone job read now is the next batch: its
        claim counts its device start too, and the batch skips `JobConsumer.start`."""
        now = self.clock.now_ms()
        limit = self.settings.max_deliveries if idle and len(entries) == 1 else 0
        claimed = await self.queue.claim([e.job_id for e in entries], now, start_limit=limit)
        out = Arrivals()
        ready: list[tuple[Entry, Job, bool]] = []
        for entry, c in zip(entries, claimed, strict=True):
            if c is None or c.job.status.is_final:
                out.stale.append(entry)  # record expired, cancelled, or a duplicate delivery
            elif c.job.cancel_requested:  # cancelled while it ran on a worker that then died
                message = "cancelled by the client while running; its worker stopped"
                state = JobState(c.job, entry, 0)
                out.decided.append(
                    (state, JobError(ErrorCode.CANCELLED, message), Status.CANCELLED)
                )
            elif (verdict := self._verdict(c.job, now)) is not None:
                state = JobState(c.job, entry, 0, dead_letter=verdict.code == ErrorCode.POISONED)
                status = Status.EXPIRED if verdict.code == ErrorCode.EXPIRED else Status.FAILED
                out.decided.append((state, verdict, status))
            else:
                ready.append((entry, c.job, c.started))
        if len(ready) == 1 and ready[0][2] and len(ready[0][1].inputs) == 1:
            out.alone = ready[0][0], ready[0][1]  # counted (`started`): the worker was idle
        elif ready:
            await self._prepare_held(ready, out)
        return out

    async def _prepare_held(self, ready: list[tuple[Entry, Job, bool]], out: Arrivals) -> None:
        jobs = [(entry, job) for entry, job, _ in ready]
        size = sum(inputs_bytes(job.inputs) for _, job in jobs)
        if self.prepare_cost.inline(size):
            prepared = self._prepare_timed(jobs, size)
        else:
            loop = asyncio.get_running_loop()
            prepared = await loop.run_in_executor(self._prepare, self._prepare_timed, jobs, size)
        arrived = self.clock.monotonic()
        for (entry, job, started), result in zip(ready, prepared, strict=True):
            if isinstance(result, JobError):
                out.decided.append((JobState(job, entry, 0), result, Status.FAILED))
                continue
            state = JobState(
                job,
                entry,
                remaining=len(result),
                outputs=[None] * len(result),
                counted=started,
                start_checked=started,
            )
            items = [
                Item(key=Work(state, i, p.payload), cost=p.cost, arrived=arrived)
                for i, p in enumerate(result)
            ]
            out.held.append((state, items))

    def _verdict(self, job: Job, now_ms: int) -> JobError | None:
        # `attempts` counts device starts that never finished (see scripts.START).
        limit = self.settings.max_deliveries
        if job.attempts >= limit:
            msg = f"started {job.attempts} times without finishing (INFERQ_MAX_DELIVERIES={limit})"
            log.error("job %s poisoned: %s; dead-lettered", job.id, msg)
            return JobError(ErrorCode.POISONED, msg)
        if job.deadline_ms and now_ms > job.deadline_ms:
            return JobError(ErrorCode.EXPIRED, "deadline passed in queue")
        return None

    def _prepare_timed(
        self, ready: list[tuple[Entry, Job]], size: int
    ) -> list[list[Prepared] | JobError]:
        start = self.prepare_timer()
        out = self._prepare_all(ready)
        self.prepare_cost.observe(size, self.prepare_timer() - start)
        return out

    def _prepare_all(self, ready: list[tuple[Entry, Job]]) -> list[list[Prepared] | JobError]:
        """Every job in one `prepare_many` call when the model has one (for a tokenizer, one
        call over all their texts instead of one per job); one job at a time when it has
        none, when only one job is ready, or when the batched call fails (so a bad input
        fails only its own job)."""
        if len(ready) < 2 or not isinstance(self.model, PreparesMany):
            return [self.prepare_one(job) for _, job in ready]
        out: list[list[Prepared] | JobError] = []
        typed: list[tuple[int, Job, list[Input]]] = []  # (where in `out`, job, its inputs)
        for _, job in ready:
            try:
                typed.append((len(out), job, typed_inputs(job.inputs, self.model.inputs)))
                out.append([])
            except InvalidInput as e:
                out.append(JobError(ErrorCode.INVALID_INPUT, str(e)))
        try:
            with self._prepare_lock:
                many = self.model.prepare_many([(inp, job.parameters) for _, job, inp in typed])
            if len(many) != len(typed):
                raise ModelError("prepare_many() must return one list per job")
            for (i, _, inputs), prepared in zip(typed, many, strict=True):
                out[i] = _checked(prepared, len(inputs))
        except Exception:  # find the guilty job: one at a time, each failing alone
            for i, job, _ in typed:
                out[i] = self.prepare_one(job)
        return out

    def prepare_one(self, job: Job) -> list[Prepared] | JobError:
        """A job's inputs as the model prepared them, or the error that fails the job. In any
        thread: calls into the model's `prepare` are serialised (its contract does not
        promise it may run twice at once)."""
        try:
            inputs = typed_inputs(job.inputs, self.model.inputs)
            with self._prepare_lock:
                prepared = self.model.prepare(inputs, job.parameters)
            return _checked(prepared, len(job.inputs))
        except InvalidInput as e:  # undecodable, too large, a bad parameter value...
            return JobError(ErrorCode.INVALID_INPUT, str(e))
        except Exception as e:  # a bad input fails its own job before it reaches a batch
            return JobError(ErrorCode.MODEL_ERROR, f"{type(e).__name__}: {e}")


def typed_inputs(raw: list[Any], accepted: frozenset[InputKind]) -> list[Input]:
    """A job's inputs as the model sees them (`inferq.shared.jobs.decode_input`)."""
    out = []
    for i, value in enumerate(raw):
        try:
            kind, decoded = decode_input(value)
        except ValueError as e:
            raise InvalidInput(i, str(e)) from e
        item = Input(kind, Tensor(*decoded) if isinstance(decoded, tuple) else decoded)
        if item.kind not in accepted:
            kinds = ", ".join(sorted(accepted))
            raise InvalidInput(i, f"{item.kind} input, but this model takes {kinds}")
        out.append(item)
    return out
