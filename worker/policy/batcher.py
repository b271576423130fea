"""Microbatching policy: which pending items form the next batch, and when it is due.

Pure logic (stdlib only, no I/O, no clock): callers pass ``now`` in monotonic seconds.

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
from typing import Any


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
