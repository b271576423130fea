"""One batch while this process holds its lease (`BatchRun`); `BatchLeases`
(`inferq.api.batches.leases`) takes the leases and starts a run per batch.

`BatchRun` reads the input file and the lines already recorded, then keeps up to
`INFERQ_BATCH_IN_FLIGHT` lines submitted as jobs in the `low` lane (through
`JobService.submit`: admission, validation, metrics), and copies each finished job's answer
into `keys.batch_results` as it completes (job records expire after `INFERQ_RESULT_TTL_S`;
the results hash lasts as long as the batch). When every line has a result it writes the
output and error files and ends the batch. Why a crash at any point loses or doubles
nothing: see `inferq.api.batches.leases`.

Admission comes first: a 429 from the queue is waited out (`Retry-After`, at most
`MAX_BACKOFF_S`), never recorded as a failed line. A cancelled or expired batch stops
submitting, cancels its lines' jobs that no worker has started, waits for the others (at
most `ENDING_GRACE_S`) and records every line not run as `batch_cancelled` /
`batch_expired` in the error file. One taken over while stopping first submits its first
`INFERQ_BATCH_IN_FLIGHT` unrecorded lines again (`_adopt`), which finds the jobs the last
holder left, so their results count and the queued ones get cancelled.

A run asked to hand its lease back (`hand_back`: another tenant waits for a slot, see
`inferq.api.batches.leases`) records what has finished and stops at its loop's next turn
(`HandedBack`), its submitted jobs left running: the next holder submits those lines again
and finds them under their idempotency keys, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from inferq.api.batches.files import FileStore, FileWriter
from inferq.api.batches.lines import (
    ENDPOINTS,
    ERROR,
    OK,
    Line,
    LineError,
    custom_id_of,
    envelope,
    error_line,
    result_line,
    split_lines,
)
from inferq.api.batches.store import BatchRecord, BatchStore, output_ids
from inferq.api.core.service import JobService
from inferq.api.protocols.embeddings import Answer
from inferq.shared.errors import JobNotFound, Overloaded, RedisFull, RequestError
from inferq.shared.jobs import Job, Status
from inferq.shared.metrics import ApiMetrics
from inferq.shared.schema import BatchStatus

log = logging.getLogger("inferq.api.batches")

STATUS_S = 0.5  # how often a running batch re-reads its record (cancel, expiry)
MAX_BACKOFF_S = 5.0  # longest wait after a 429 before submitting again
MAX_KEYS = 8  # idempotency keys one line may go through (see `leases`' docstring)
READS = 16  # job records read at once by one batch (the pool serves the requests too)
# A stopping batch waits this long for its running lines (their outputs are kept), then
# records them as not run: a job stuck on a dead worker with no replacement cannot hold a
# cancelled batch in `cancelling` until its expiry.
ENDING_GRACE_S = 60.0
ENDING: dict[str, str] = {
    BatchStatus.CANCELLED: "batch_cancelled",
    BatchStatus.EXPIRED: "batch_expired",
}


class Gone(Exception):
    """The batch ended or vanished under this run (another holder finished it)."""


class HandedBack(Gone):
    """The run stopped to hand its lease back (`BatchRun.hand_back`); the batch goes on."""


@dataclass(slots=True)
class Flight:
    """One submitted line whose job is not final yet."""

    line: Line
    custom_id: str
    request: Any
    watch: asyncio.Future[Any]


class BatchRun:
    """One batch, run while this process holds its lease. `run` returns when the batch
    has ended; it raises `QueueUnavailable` (the holder retries) and `Gone`."""

    def __init__(
        self,
        rec: BatchRecord,
        store: BatchStore,
        files: FileStore,
        jobs: JobService,
        metrics: ApiMetrics,
    ) -> None:
        self.rec = rec
        self.id = rec.id
        self.endpoint = ENDPOINTS[rec.endpoint]
        self.store = store
        self.files = files
        self.jobs = jobs
        self.metrics = metrics
        self.window = jobs.settings.batch_in_flight
        self.max_values = jobs.settings.max_json_values  # a line over it is never parsed
        self.recheck_s = jobs.settings.long_poll_recheck_s
        self.wake = asyncio.Event()  # a watched job may have changed, or a poke
        self.pending: deque[Line] = deque()
        self.flights: dict[str, Flight] = {}  # job id → its line
        self.results: list[tuple[int, bytes, bytes]] = []  # to record: (line, kind, JSON)
        self.ending: str | None = None  # "cancelled" or "expired" once the batch stops
        self.ended_at = 0.0  # loop time of the stop
        self.resume_at = 0.0  # no submits before this (loop time), after a 429
        self.handing_back = False  # asked to stop and hand the lease back (`hand_back`)

    def hand_back(self) -> None:
        """Stop at the loop's next turn, what has finished recorded, and raise HandedBack.
        A batch already ending finishes instead: its end is near."""
        self.handing_back = True
        self.wake.set()

    async def run(self) -> None:
        try:
            src = await self.files.get(self.rec.input_file_id, self.rec.tenant)
            content = await self.files.read(src)
        except JobNotFound:
            content = None
        if content is None:
            await self._fail("input_file_missing", f"input file {self.rec.input_file_id!r} is gone")
            return
        lines = await asyncio.to_thread(split_lines, content)
        del content
        done = await self.store.done_lines(self.id)
        self.pending.extend(line for line in lines if line.number not in done)
        started = bool(
            self.rec.fields.get(BatchStatus.IN_PROGRESS.timestamp)
        )  # did a runner submit lines?
        status = await self.store.advance(self.id, BatchStatus.IN_PROGRESS, BatchStatus.VALIDATING)
        if status not in (BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING, BatchStatus.FINALIZING):
            raise Gone(status)
        log.info("batch %s: running, %d of %d lines to go", self.id, len(self.pending), len(lines))
        try:
            await self._loop(adopt=started)
        finally:
            for job_id, flight in self.flights.items():
                self.jobs.notifier.unwatch(job_id, flight.watch)
        await self._finalize(lines)

    async def _loop(self, *, adopt: bool) -> None:
        loop = asyncio.get_running_loop()
        next_status = next_recheck = loop.time()
        while self.pending or self.flights:
            await self._hand_back_if_asked()
            now = loop.time()
            if now >= next_status:
                next_status = now + STATUS_S
                ending = await self._ending()
                if ending and not self.ending:
                    if adopt:  # taken over while ending: find the jobs the last holder ran
                        await self._adopt()
                    await self._end(ending)
            adopt = False
            if not self.ending:
                await self._fill()
            await self._flush()
            if not (self.pending or self.flights):
                break
            until = min(next_status, next_recheck)
            if self.pending and not self.ending and len(self.flights) < self.window:
                until = min(until, max(self.resume_at, now))
            await self._wait(max(0.0, until - loop.time()))
            if loop.time() >= next_recheck:  # pub/sub is a hint: re-read every job now and then
                next_recheck = loop.time() + self.recheck_s
                ready = list(self.flights)
            else:
                ready = [j for j, f in self.flights.items() if f.watch.done()]
            await self._check(ready)
            if self.ending and loop.time() > self.ended_at + ENDING_GRACE_S:
                self._abandon()
        await self._flush()

    async def _hand_back_if_asked(self) -> None:
        if self.handing_back and not self.ending:
            await self._flush()
            raise HandedBack(self.id)

    async def _ending(self) -> str | None:
        rec = await self.store.load(self.id)
        if rec is None or rec.final:
            raise Gone(rec.status if rec else "deleted")
        self.rec = rec
        if rec.status == BatchStatus.CANCELLING:
            return BatchStatus.CANCELLED
        if time.time() >= rec.expires_at:
            return BatchStatus.EXPIRED
        return None

    async def _end(self, ending: str) -> None:
        """Stop: every line not submitted is recorded as not run; queued jobs are cancelled."""
        self.ending = ending
        self.ended_at = asyncio.get_running_loop().time()
        code = ENDING[ending]
        while self.pending:
            line = self.pending.popleft()
            self.results.append((line.number, *self._not_run(line, None, code)))
        for job_id in list(self.flights):
            with contextlib.suppress(RequestError):  # already running or ended: it finishes
                await self.jobs.cancel(job_id, self.rec.tenant, only_if_queued=True)
        log.info("batch %s: %s; waiting for %d running lines", self.id, ending, len(self.flights))

    def _abandon(self) -> None:
        if self.flights:
            log.warning(
                "batch %s: %d lines still running %.0fs after it stopped; recorded as not run",
                self.id,
                len(self.flights),
                ENDING_GRACE_S,
            )
        code = ENDING[self.ending or BatchStatus.CANCELLED]
        for job_id, flight in self.flights.items():
            self.jobs.notifier.unwatch(job_id, flight.watch)
            n = flight.line.number
            self.results.append((n, *self._not_run(flight.line, flight.custom_id, code)))
        self.flights.clear()

    def _not_run(self, line: Line, custom_id: str | None, code: str) -> tuple[bytes, bytes]:
        why = "the batch was cancelled" if code == "batch_cancelled" else "the batch expired"
        cid = custom_id if custom_id is not None else custom_id_of(line, self.max_values)
        return error_line(self.id, line.number, cid, code, f"not run: {why}")

    async def _fill(self) -> None:
        """Submit lines until `window` are in flight or the queue says 429."""
        loop = asyncio.get_running_loop()
        while self.pending and len(self.flights) < self.window and loop.time() >= self.resume_at:
            if not await self._submit(self.pending[0]):
                return  # 429: the line stays first in line
            self.pending.popleft()

    async def _adopt(self) -> None:
        """Lines are submitted in file order with at most `window` unfinished, so every
        job the last holder left running is among the first `window` lines not recorded.
        Submitting those again finds them (same keys); `_end` then cancels what is queued."""
        head = [self.pending.popleft() for _ in range(min(self.window, len(self.pending)))]
        for line in head:
            if not await self._submit(line):  # 429: so it was never submitted
                self.pending.append(line)

    async def _submit(self, line: Line) -> bool:
        """Submit one line (or record why it cannot run); False on a 429."""
        try:
            env = envelope(line, self.rec.endpoint, self.max_values)
        except LineError as e:
            self.results.append(
                (line.number, *error_line(self.id, line.number, e.custom_id, e.code, str(e)))
            )
            return True
        req = self.endpoint.parse(env.body)
        if not isinstance(req, Answer):
            req = await self.endpoint.bind(req, self.jobs.catalog)
        if isinstance(req, Answer):  # what the endpoint answers to this body: a 4xx
            self.results.append(
                (line.number, *result_line(self.id, line.number, env.custom_id, req, None))
            )
            return True
        timeout_s = max(1.0, self.rec.expires_at - time.time())  # lines live as long as the batch
        for gen in range(MAX_KEYS):
            key = f"batch:{self.id}:{line.number}" + (f":{gen}" if gen else "")
            sub = self.endpoint.submission(
                req, self.rec.tenant, priority="low", idempotency_key=key, timeout_s=timeout_s
            )
            try:
                job = await self.jobs.submit(sub)
            except (Overloaded, RedisFull) as e:  # waited out, as a client would: not a failure
                delay = min(float(e.retry_after_s), MAX_BACKOFF_S)
                self.resume_at = asyncio.get_running_loop().time() + delay
                return False
            except JobNotFound:
                continue  # this key's job expired before its result was copied: next key
            except RequestError as e:
                answer = self.endpoint.refusal(e)
                self.results.append(
                    (line.number, *result_line(self.id, line.number, env.custom_id, answer, None))
                )
                return True
            self._track(Flight(line, env.custom_id, req, self._watch(job.id)), job)
            return True
        message = f"line {line.number}: its job records expired {MAX_KEYS} times before being read"
        self.results.append(
            (line.number, *error_line(self.id, line.number, env.custom_id, "lost", message))
        )
        return True

    def _track(self, flight: Flight, job: Job) -> None:
        if job.status.is_final:
            self.jobs.notifier.unwatch(job.id, flight.watch)
            self._done(flight, job)
        else:
            self.flights[job.id] = flight

    def _done(self, flight: Flight, job: Job) -> None:
        n = flight.line.number
        if self.ending and job.status in (Status.CANCELLED, Status.EXPIRED):
            self.results.append(
                (n, *self._not_run(flight.line, flight.custom_id, ENDING[self.ending]))
            )
            return
        answer = self.endpoint.answer(flight.request, job)
        self.results.append((n, *result_line(self.id, n, flight.custom_id, answer, job.id)))

    def _watch(self, job_id: str) -> asyncio.Future[Any]:
        # One callback per watch wakes the loop: no re-registering on every watched future
        # per wait, which would cost O(window) on each of thousands of waits.
        fut = self.jobs.notifier.watch(job_id)
        fut.add_done_callback(lambda _: self.wake.set())
        return fut

    async def _wait(self, timeout_s: float) -> None:
        """Until a watched job may have changed, the runner pokes us, or the timeout. The
        caller then scans for done watches, so a wake cleared here is never lost."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.wake.wait()
        self.wake.clear()

    async def _check(self, job_ids: list[str]) -> None:
        """Re-read these jobs (watching first, so no completion slips in between)."""
        limit = asyncio.Semaphore(READS)
        notifier = self.jobs.notifier

        async def one(job_id: str) -> None:
            flight = self.flights[job_id]
            notifier.unwatch(job_id, flight.watch)
            flight.watch = self._watch(job_id)
            async with limit:
                try:
                    job = await self.jobs.get(job_id, self.rec.tenant, listen=True)
                except JobNotFound:  # its record vanished (Redis flushed?): submit it again
                    notifier.unwatch(job_id, flight.watch)
                    del self.flights[job_id]
                    if self.ending:
                        code = ENDING[self.ending]
                        n = flight.line.number
                        self.results.append(
                            (n, *self._not_run(flight.line, flight.custom_id, code))
                        )
                    else:
                        self.pending.appendleft(flight.line)
                    return
            if job.status.is_final:
                notifier.unwatch(job_id, flight.watch)
                del self.flights[job_id]
                self._done(flight, job)

        await asyncio.gather(*(one(j) for j in job_ids))

    async def _flush(self) -> None:
        if not self.results:
            return
        results, self.results = self.results, []
        ok, err = await self.store.record(self.id, results)
        if ok:
            self.metrics.batch_lines.labels(result="succeeded").inc(ok)
        if err:
            self.metrics.batch_lines.labels(result="failed").inc(err)

    async def _final_status(self) -> str:
        """The status the batch ends in: its ending (cancelled, expired), else completed once
        it is `finalizing` (cancelled if a cancel raced the last line: every line ran)."""
        if self.ending is not None:
            return self.ending
        now = await self.store.advance(self.id, BatchStatus.FINALIZING, BatchStatus.IN_PROGRESS)
        if now == BatchStatus.CANCELLING:
            return BatchStatus.CANCELLED
        if now != BatchStatus.FINALIZING:
            raise Gone(now)
        return BatchStatus.COMPLETED

    async def _write_files(self, lines: list[Line]) -> dict[bytes, int]:
        """The output and error files, from the recorded results in line order; how many
        lines went to each."""
        out_id, err_id = output_ids(self.id)
        out, err = self.files.writer(out_id), self.files.writer(err_id)
        try:
            return await self._fill_files(lines, out, err)
        except BaseException:
            for w in (out, err):  # a finalize re-run writes them again
                await w.abort()
            raise

    async def _fill_files(
        self, lines: list[Line], out: FileWriter, err: FileWriter
    ) -> dict[bytes, int]:
        counts = {OK: 0, ERROR: 0}
        numbers = [line.number for line in lines]
        for start in range(0, len(numbers), 512):
            chunk = numbers[start : start + 512]
            for number, value in zip(chunk, await self.store.results(self.id, chunk), strict=True):
                if value is None:  # never while the lease is ours: a late ex-holder stops here
                    log.error("batch %s: line %d has no result at finalize", self.id, number)
                    raise Gone("results missing")
                kind = value[:1]
                counts[kind] = counts.get(kind, 0) + 1
                await (out if kind == OK else err).write(value[1:] + b"\n")
        tenant = self.rec.tenant
        if counts[OK]:
            await out.close(tenant, f"{self.id}_output.jsonl", "batch_output")
        if counts[ERROR]:
            await err.close(tenant, f"{self.id}_error.jsonl", "batch_output")
        return counts

    async def _finalize(self, lines: list[Line]) -> None:
        """Write the output and error files from the recorded results, then end the batch."""
        status = await self._final_status()
        rec = await self.store.load(self.id)
        if rec is None or rec.final:  # another holder has finished it: leave its files alone
            raise Gone(rec.status if rec else "deleted")
        counts = await self._write_files(lines)
        out_id, err_id = output_ids(self.id)
        ended = await self.store.finish(
            self.id,
            status,
            output_file_id=out_id if counts[OK] else "",
            error_file_id=err_id if counts[ERROR] else "",
        )
        if ended:
            self.metrics.batches_finished.labels(status=status).inc()
            log.info(
                "batch %s: %s, lines=%d ok=%d errors=%d",
                self.id,
                status,
                len(lines),
                counts[OK],
                counts[ERROR],
            )

    async def _fail(self, code: str, message: str) -> None:
        error = {"code": code, "message": message, "param": "input_file_id", "line": None}
        if await self.store.finish(self.id, BatchStatus.FAILED, errors=[error]):
            self.metrics.batches_finished.labels(status="failed").inc()
            log.warning("batch %s: failed: %s", self.id, message)
