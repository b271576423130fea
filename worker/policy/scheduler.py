"""What runs next on the device: the whole batch policy as one pure object.

It owns the batcher (`inferq.worker.policy.batcher`), the live ceiling (`LiveCeiling`), how
many batches may run at once and how big a batch beside others may be (`limits`), the solo
re-runs of suspect jobs, and how a batch that must not run whole is split. Pure: no I/O and
no clock; callers pass `now` (monotonic seconds) and how many batches are running.

Invariants of `next`:

* It never returns an empty batch, nor one over the live ceiling (padded cost = items ×
  largest) or the size bound, except a single item (which may still be too large: the
  executor finds out).
* At most `streams` batches run at once: with `running >= streams` nothing is due.
* A suspect job (it was on a device when a worker died) never shares the device: its
  batches start only when nothing runs, nothing else starts while any of its items is
  pending, and of several suspects the one with the fewest attempts goes first.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from inferq.worker.policy.batcher import Batch, Batcher, Item, padded_cost


class LiveCeiling:
    """The live token ceiling: lowered below a size that ran out of memory, raised back slowly.

    Invariants: `floor <= value <= ceiling` always; after an OOM at `failed_tokens` the value
    is below `failed_tokens` (unless already at the floor); it rises one step per
    `recover_after` consecutive successful batches, never above `ceiling` (the calibrated or
    configured bound)."""

    def __init__(
        self, ceiling: int, floor: int, recover_after: int, step_fraction: float = 0.125
    ) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"need 1 <= floor ({floor}) <= ceiling ({ceiling})")
        self.ceiling = ceiling
        self.floor = floor
        self.recover_after = recover_after
        self.step = max(1, int(ceiling * step_fraction))
        self.value = ceiling
        self.lowered = 0
        self.raised = 0
        self._successes = 0

    def on_oom(self, failed_tokens: int) -> int:
        """A batch of `failed_tokens` padded tokens ran out of memory: go below it."""
        self._successes = 0
        target = max(self.floor, min(self.value, failed_tokens * 3 // 4))
        if target < self.value:
            self.value = target
            self.lowered += 1
        return self.value

    def on_success(self) -> int:
        if self.value >= self.ceiling:
            return self.value
        self._successes += 1
        if self._successes >= self.recover_after:
            self._successes = 0
            self.value = min(self.ceiling, self.value + self.step)
            self.raised += 1
        return self.value


# When several batches may run at once: how big the next one may be, and how long it waits.
# The scheduler sets the batcher's `max_batch_size` and `max_wait_s` from `limits` before
# each call (they are read live).
#
# With nothing running, the device is idle: the configured bounds apply and a batch starts
# after the configured wait (0 by default: at once). With another batch already running, a
# free stream that started at once would take whatever few items had arrived: under a closed
# loop of 32 clients on 2 one-thread streams, batches settled at ~6.5 items, where one thread
# does ~115 items/s against ~160 at 16 (2-core box, traced minilm, short sentences). So while
# other batches run, the next one is due when it holds its share of the batch size
# (max_batch_size / streams), or when its oldest item has waited a quarter of a recent batch's
# run time; at most that share plus the wait, latency stays well inside one batch's run.

BUSY_WAIT_SHARE = 0.25  # of the recent batch run time


@dataclass(frozen=True, slots=True)
class Limits:
    max_batch_size: int
    max_wait_s: float


def limits(
    running: int, streams: int, max_batch_size: int, max_wait_s: float, recent_run_s: float
) -> Limits:
    """Bounds for the next batch, with `running` of `streams` batches on the device now."""
    if running <= 0 or streams <= 1:
        return Limits(max_batch_size, max_wait_s)
    share = max(1, max_batch_size // streams)
    return Limits(share, max(max_wait_s, BUSY_WAIT_SHARE * max(0.0, recent_run_s)))


def smooth(previous_s: float, run_s: float, weight: float = 0.2) -> float:
    """Exponentially weighted recent run time (the first batch sets it)."""
    return run_s if previous_s <= 0 else previous_s + weight * (run_s - previous_s)


class Owner(Protocol):
    """Whose items these are (a job, to the worker): only compared by identity here, and
    asked how suspect it is. An item's `key` names its owner as `key.state`."""

    @property
    def suspect(self) -> bool:
        """It was on a device when a worker died: its items run alone."""

    @property
    def attempts(self) -> int:
        """Device starts that never finished: of several suspects, the fewest go first."""


def owner_of(item: Item) -> object:
    return item.key.state


@dataclass(frozen=True, slots=True)
class Next:
    """A batch to start now, or when to ask again (None: when something changes)."""

    batch: Batch | None = None
    wake_at: float | None = None


class Scheduler:
    def __init__(
        self,
        ceiling: LiveCeiling,
        *,
        max_batch_size: int,
        max_wait_s: float,
        min_fill: float,
        streams: int = 1,
    ) -> None:
        self.ceiling = ceiling
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.min_fill = min_fill
        self.streams = max(1, streams)
        self.batcher = Batcher(ceiling.value, max_batch_size, max_wait_s, min_fill)
        self.recent_run_s = 0.0  # smoothed batch run time: how long a busy stream waits
        self._suspects: list[tuple[Owner, list[Item]]] = []  # waiting to run alone
        self._solo: Batcher | None = None  # the suspect whose batches run now, alone

    # --- items in ---
    def add(self, state: Owner, items: list[Item]) -> None:
        if state.suspect:
            self._suspects.append((state, items))
        else:
            self.batcher.extend(items)

    def drop(self, state: Owner) -> None:
        """Forget every pending item of `state` (it failed, was cancelled or handed back)."""
        self.drop_all([state])

    def drop_all(self, states: Collection[Owner]) -> None:
        """`drop` each of `states` in one pass over the pending items, however many they are
        (a stop hands back every held job; a stalled device expires them together)."""
        if not states:
            return
        gone = {id(s) for s in states}
        self.batcher.remove(lambda it: id(owner_of(it)) in gone)
        self._suspects = [(s, items) for s, items in self._suspects if id(s) not in gone]
        if self._solo is not None:
            self._solo.remove(lambda it: id(owner_of(it)) in gone)
            if not len(self._solo):
                self._solo = None

    def pending(self) -> int:
        """Items waiting for a batch."""
        solo = len(self._solo) if self._solo is not None else 0
        return len(self.batcher) + solo + sum(len(items) for _, items in self._suspects)

    def oldest_arrival(self) -> float | None:
        return self.batcher.oldest_arrival()

    # --- what runs next ---
    def next(self, now: float, running: int) -> Next:
        if self._solo is not None or self._suspects:
            return self._next_solo(now, running)
        if running >= self.streams:
            return Next()
        lim = limits(running, self.streams, self.max_batch_size, self.max_wait_s, self.recent_run_s)
        b = self.batcher
        b.max_batch_size, b.max_wait_s, b.max_batch_tokens = (
            lim.max_batch_size,
            lim.max_wait_s,
            self.ceiling.value,
        )
        batch = b.next_batch(now)
        return Next(batch=batch) if batch is not None else Next(wake_at=b.due_at())

    def _next_solo(self, now: float, running: int) -> Next:
        if running:
            return Next()  # a suspect runs with nothing beside it: wait for the device
        if self._solo is None:
            # Least suspicious first: a job that was on the device at more crashes waits.
            state, items = min(self._suspects, key=lambda si: si[0].attempts)
            self._suspects = [(s, i) for s, i in self._suspects if s is not state]
            self._solo = Batcher(self.ceiling.value, self.max_batch_size, 0.0, self.min_fill)
            self._solo.extend(items)
        self._solo.max_batch_tokens = self.ceiling.value
        batch = self._solo.next_batch(now, force=True)
        if not len(self._solo):
            self._solo = None
        return Next(batch=batch)

    # --- what the device said ---
    def fits(self, items: list[Item]) -> bool:
        """Whether `items` may run as one batch under the live ceiling (one item always may)."""
        return len(items) <= 1 or padded_cost(items) <= self.ceiling.value

    @staticmethod
    def split(items: list[Item]) -> tuple[list[Item], list[Item]]:
        """Two halves by cost (halves of similar cost pad less), the cheaper first."""
        ordered = sorted(items, key=lambda it: it.cost)
        half = len(ordered) // 2
        return ordered[:half], ordered[half:]

    def on_success(self, run_s: float) -> int | None:
        """A batch ran; returns the new live ceiling if this raised it, else None."""
        self.recent_run_s = smooth(self.recent_run_s, run_s)
        before = self.ceiling.value
        after = self.ceiling.on_success()
        return after if after > before else None

    def on_oom(self, padded: int) -> tuple[int, int]:
        """A batch of `padded` cost ran out of memory: (ceiling before, ceiling after)."""
        before = self.ceiling.value
        return before, self.ceiling.on_oom(padded)
