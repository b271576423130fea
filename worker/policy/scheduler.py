"""What runs next on the device: the whole batch policy as one pure object.

Two layers, in this order below. The batcher (`Batcher`) decides which pending items form
the next batch and when it is due. The scheduler (`Scheduler`) owns it, the live ceiling
(`LiveCeiling`), how many batches may run at once and how big a batch beside others may be
(`limits`), the solo re-runs of suspect jobs, and how a batch that must not run whole is
split. Pure: no I/O and no clock; callers pass `now` (monotonic seconds) and how many
batches are running.

Invariants of `next`:

* It never returns an empty batch, nor one over the live ceiling (padded cost = items ×
  largest) or the size bound, except a single item (which may still be too large: the
  executor finds out).
* At most `streams` batches run at once: with `running >= streams` nothing is due.
* A suspect job (it was on a device when a worker died) never shares the device: its
  batches start only when nothing runs, nothing else starts while any of its items is
  pending, and of several suspects the one with the fewest attempts goes first.

Invariants of ``Batcher.next_batch``:

* It returns None when nothing is due; otherwise a non-empty ``Batch`` whose items leave the
  pending set, listed in add order.
* Fairness: the oldest pending item (the *anchor*, by add order) is always in the batch, so
  an item is served after at most as many batches as there are items added before it.
* Bounds: ``len(items) <= max_batch_size`` and ``padded_tokens <= max_batch_tokens``, where
  ``padded_tokens == len(items) * max(cost)``. Sole exception: an anchor whose cost alone
  exceeds ``max_batch_tokens`` is returned alone and at once, since nothing could ever join it.
* Packing: in (cost, add order) order the batch grows from the anchor over a run contiguous
  in cost, each step taking the shorter or longer neighbour whose cost is closest to the
  anchor's (ties: shorter, then older) while both bounds hold and the batch stays at least
  ``min_fill`` full (real tokens ÷ padded tokens: padding is compute spent on nothing). Among
  equal costs the older items are taken. With ``min_fill == 0``, unless the batch is
  size-full, no item left pending could join it without breaking the token bound.
* Due when ``force`` is set; when the packing is full (it reached ``max_batch_size``, or a bound
  stopped it while items remain pending); or when ``now >= oldest.arrived + max_wait_s``.
  Equivalently, nothing is due iff not forced, before the wait, fewer than ``max_batch_size``
  items pend and all of them together fit the token bound.

Costs must not change after ``add``. ``max_batch_tokens``, ``max_batch_size`` and ``max_wait_s``
are plain attributes read on every call, so live changes take effect on the next call.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol


@dataclass(slots=True)
class Item:
    key: Any
    cost: int
    arrived: float


@dataclass(slots=True)
class Batch:
    items: list[Item]
    padded_tokens: int


_COST = attrgetter("cost")


def padded_cost(items: list[Item]) -> int:
    """What `items` cost as one batch: each padded to the longest."""
    # map over attrgetter: the max runs in C, with no Python frame an item
    return len(items) * max(map(_COST, items)) if items else 0


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class Batcher:
    def __init__(
        self, max_batch_tokens: int, max_batch_size: int, max_wait_s: float, min_fill: float = 0.0
    ) -> None:
        self.max_batch_tokens = _positive_int("max_batch_tokens", max_batch_tokens)
        if not 0.0 <= min_fill <= 1.0:
            raise ValueError(f"min_fill must be within [0, 1], got {min_fill!r}")
        self.min_fill = float(min_fill)
        self.max_batch_size = _positive_int("max_batch_size", max_batch_size)
        if isinstance(max_wait_s, bool) or not isinstance(max_wait_s, int | float):
            raise ValueError(f"max_wait_s must be a number >= 0, got {max_wait_s!r}")
        if not max_wait_s >= 0:  # written this way so NaN is rejected too
            raise ValueError(f"max_wait_s must be a number >= 0, got {max_wait_s!r}")
        self.max_wait_s = float(max_wait_s)
        # seq -> item. A dict keeps add order with O(1) delete. A batch's items are popped
        # one by one (a batch's worth of work, not the whole pending set's); the anchor lookup
        # then skips the deleted slots in C until the dict next resizes and compacts them.
        self._items: dict[int, Item] = {}
        # (cost, seq), seq breaking cost ties by add order. add() only appends; the lazy sort is
        # near-linear because Timsort merges the sorted prefix with the short unsorted tail.
        self._by_cost: list[tuple[int, int]] = []
        self._unsorted = False
        self._seq = 0
        self._tokens = 0

    def add(self, item: Item) -> None:
        self.extend([item])

    def extend(self, items: Sequence[Item]) -> None:
        """`add` each of `items` in order, or none of them if a cost is invalid."""
        # Checked, numbered and appended in C (map, zip, min): no Python frame an item. A bad
        # cost is found before anything changes; `_positive_int` then names it.
        costs = list(map(_COST, items))
        if not costs:
            return
        if set(map(type, costs)) != {int} or min(costs) < 1:  # a bool's type is not int
            for c in costs:
                _positive_int("cost", c)
        seqs = range(self._seq, self._seq + len(costs))
        self._seq += len(costs)
        self._items.update(zip(seqs, items, strict=True))
        entries = list(zip(costs, seqs, strict=True))
        if (self._by_cost and entries[0] < self._by_cost[-1]) or costs != sorted(costs):
            self._unsorted = True
        self._by_cost += entries
        self._tokens += sum(costs)

    def __len__(self) -> int:
        return len(self._items)

    def pending_tokens(self) -> int:
        return self._tokens

    def oldest_arrival(self) -> float | None:
        return next(iter(self._items.values())).arrived if self._items else None

    def due_at(self) -> float | None:
        oldest = self.oldest_arrival()
        return None if oldest is None else oldest + self.max_wait_s

    def next_batch(self, now: float, *, force: bool = False) -> Batch | None:
        if not self._items:
            return None
        if self._unsorted:
            self._by_cost.sort()
            self._unsorted = False
        seq, anchor = next(iter(self._items.items()))
        a = bisect_left(self._by_cost, (anchor.cost, seq))
        lo, hi, top = self._grow(a)
        count = hi - lo + 1
        padded = count * top
        full = (
            count >= self.max_batch_size
            or count < len(self._items)
            or padded > self.max_batch_tokens  # oversize anchor: waiting cannot help it
        )
        if not (force or full or now >= anchor.arrived + self.max_wait_s):
            return None
        runs = self._choose(lo, a, hi)
        order = self._by_cost
        taken = sorted([seq for start, stop in runs for _, seq in order[start:stop]])
        items = [self._items.pop(s) for s in taken]
        for start, stop in runs:  # last run first: the earlier ones keep their indices
            del order[start:stop]
        self._tokens -= sum(map(_COST, items))
        return Batch(items=items, padded_tokens=padded)

    def remove(self, predicate: Callable[[Item], bool]) -> list[Item]:
        # Evaluate everything first so a raising predicate leaves the state untouched.
        gone = {seq: item for seq, item in self._items.items() if predicate(item)}
        if gone:
            self._drop(gone.keys())
        return list(gone.values())

    def _grow(self, a: int) -> tuple[int, int, int]:
        """Grow the index run [lo, hi] around ``a`` in cost order; return it and its max cost."""
        order = self._by_cost
        size_cap, token_cap = self.max_batch_size, self.max_batch_tokens
        anchor_cost = top = real = order[a][0]
        fill = self.min_fill
        lo = hi = a
        while hi - lo + 1 < size_cap:
            after = hi - lo + 2
            # A neighbour that does not fit now never will: the count only grows, the max cost
            # never falls, and the next neighbour out is further from the run's costs. So
            # checking the two adjacent items is enough.
            down = (
                lo > 0
                and after * top <= token_cap
                and real + order[lo - 1][0] >= fill * after * top
            )
            up = (
                hi + 1 < len(order)
                and after * order[hi + 1][0] <= token_cap
                and real + order[hi + 1][0] >= fill * after * order[hi + 1][0]
            )
            if down and up:
                down = anchor_cost - order[lo - 1][0] <= order[hi + 1][0] - anchor_cost
            if down:
                lo -= 1
                real += order[lo][0]
            elif up:
                hi += 1
                top = order[hi][0]
                real += top
            else:
                break
        return lo, hi, top

    def _choose(self, lo: int, a: int, hi: int) -> list[tuple[int, int]]:
        """The index ranges of `_by_cost` to take for the run [lo, hi], giving a partly taken
        shorter-cost group to its oldest: disjoint, the last range first."""
        order = self._by_cost
        runs = [(a, hi + 1)]  # longer side: each group already starts with its oldest
        if lo < a:
            edge = order[lo][0]  # < anchor cost: an equal cost would be younger, so after a
            start = bisect_left(order, (edge, -1), 0, lo)  # <= lo
            end = bisect_left(order, (edge + 1, -1), lo, a)
            runs += [(end, a), (start, start + end - lo)]
        return runs

    def _drop(self, gone: Collection[int]) -> None:
        # `remove`'s: one O(n) rebuild per call, however many items leave (a dict keys view).
        self._tokens -= sum(map(_COST, map(self._items.__getitem__, gone)))
        self._items = {s: it for s, it in self._items.items() if s not in gone}
        self._by_cost = [e for e in self._by_cost if e[1] not in gone]


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
