"""The worker's per-batch bookkeeping, timed at a steady load: this checkout's and, with
`--tree`, another checkout's, side by side in one run and alternated (medians).

- `batcher`: µs a batch of the batch policy with N items pending. Each round adds 32 items
  (one 32-input job, costs drawn from 10-40 tokens, seeded) and takes one batch of 32, so
  the pending set stays at N. Both batchers see the same items and must choose the same
  batches (checked on every round), so the figures compare the same work.
- `expiry`: µs a scheduling pass of the expiry check (`Book.expire_due`, called before every
  batch is chosen) with N one-item jobs held, none due.
- `handback`, `expire_all`: µs for N held one-item jobs to leave the book at once, handed
  back (a stop) or expired (a stalled device), with `--rounds` fresh books each.

Run: .venv/bin/python scripts/pass_cost.py [--what batcher,expiry,handback,expire_all] [--sizes 32,512,4096]
     [--rounds 2000] [--repeat 3] [--tree /tmp/before]   # git worktree add /tmp/before <commit>
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from inferq.shared.jobs import Job, SystemClock
from inferq.shared.queue import Entry
from inferq.shared.settings import Settings
from inferq.worker.policy.scheduler import Item, LiveCeiling, Scheduler
from inferq.worker.telemetry import Telemetry

REPO = Path(__file__).resolve().parents[1]
BATCH = 32
DEADLINE_MS = 60_000  # every held job's: none comes due while timed
# Each part's file, newest layout first (the batcher had a module of its own until the batch
# policy became one module): the first that a tree has is loaded.
FILES = {
    "batcher": ("worker/policy/scheduler.py", "worker/policy/batcher.py"),
    "expiry": ("worker/book.py",),
    "handback": ("worker/book.py",),
    "expire_all": ("worker/book.py",),
}


def load(tree: Path, what: str, name: str) -> ModuleType:
    """`tree`'s module for `what` (its file in FILES), imported under `name`."""
    path = next((tree / f for f in FILES[what] if (tree / f).exists()), tree / FILES[what][-1])
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


# --- the batch policy ---
def _give(batcher: Any, items: list[Any]) -> None:
    if hasattr(batcher, "extend"):
        batcher.extend(items)
    else:  # an older batcher: one add an item
        for it in items:
            batcher.add(it)


def batches(
    module: ModuleType, pending: int, rounds: int, seed: int = 1
) -> tuple[float, list[Any]]:
    """µs a round (add one job's 32 items, take one batch) and the keys of every batch."""
    rnd = random.Random(seed)
    b = module.Batcher(10**9, BATCH, 0.0)
    _give(b, [module.Item(i, rnd.randint(10, 40), 0.0) for i in range(pending)])
    jobs = [
        [module.Item((r, i), rnd.randint(10, 40), 0.0) for i in range(BATCH)] for r in range(rounds)
    ]
    chosen: list[Any] = []
    t0 = time.perf_counter()
    for items in jobs:
        _give(b, items)
        chosen.append([it.key for it in b.next_batch(0.0).items])
    return (time.perf_counter() - t0) / rounds * 1e6, chosen


# --- the expiry check ---
class _Outbox:
    posting: set[str] = set()

    def post(self, final: Any) -> None:
        raise AssertionError("no job should end while timed")


def held_book(module: ModuleType, held: int) -> Any:
    """A book of `module`'s holding `held` one-item jobs, each due in a minute."""
    clock = SystemClock()
    scheduler = Scheduler(LiveCeiling(10**9, 1, 3), max_batch_size=32, max_wait_s=0.0, min_fill=0.0)
    telemetry = Telemetry(Settings(_env_file=None, model="echo"), "m", "cpu", None)
    book = module.Book("m", scheduler, _Outbox(), telemetry, clock)
    now = clock.now_ms()
    for i in range(held):
        job = Job(id=f"j{i}", model="m", inputs=["x"], deadline_ms=now + DEADLINE_MS)
        state = module.JobState(job, Entry("s", f"{i}-0", job.id), remaining=1, outputs=[None])
        book.hold(state, [Item(module.Work(state, 0, "x"), cost=1, arrived=0.0)])
    return book


def per_pass(book: Any, passes: int) -> float:
    t0 = time.perf_counter()
    for _ in range(passes):
        book.expire_due()
    return (time.perf_counter() - t0) / passes * 1e6


def expiry(module: ModuleType, held: int, passes: int) -> tuple[float, None]:
    return per_pass(held_book(module, held), passes), None


class _Accepting(_Outbox):
    def post(self, final: Any) -> None:
        pass


def _leave(module: ModuleType, held: int, rounds: int, end: Callable[[Any], None]) -> float:
    """µs for `end` to make every job of a book of `held` leave it at once (a fresh book a
    round, its building not timed)."""
    spent = 0.0
    for _ in range(max(1, rounds)):
        book = held_book(module, held)
        book.outbox = _Accepting()
        t0 = time.perf_counter()
        end(book)
        spent += time.perf_counter() - t0
        assert not book.jobs
    return spent / max(1, rounds) * 1e6


def handback(module: ModuleType, held: int, rounds: int) -> tuple[float, None]:
    """A stop: every held job handed back to the queue."""
    return _leave(module, held, rounds, lambda b: b.release(list(b.jobs.values()))), None


def expire_all(module: ModuleType, held: int, rounds: int) -> tuple[float, None]:
    """A stalled device: every held job past its deadline at once."""

    def end(book: Any) -> None:
        for state in book.jobs.values():
            state.job.deadline_ms = 1
        if hasattr(book, "_due_ms"):
            book._due_ms = 0
        book.expire_due()

    return _leave(module, held, rounds, end), None


ROUNDS: dict[str, Callable[[ModuleType, int, int], tuple[float, Any]]] = {
    "batcher": batches,
    "expiry": expiry,
    "handback": handback,
    "expire_all": expire_all,
}


def compare(
    what: str, trees: dict[str, Path], size: int, rounds: int, repeat: int
) -> dict[str, float]:
    """Median µs for each tree, alternated; raises if their batchers chose different batches."""
    modules = {name: load(tree, what, f"{what}_{name}") for name, tree in trees.items()}
    times: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(repeat):
        seen = []
        for name, module in modules.items():
            us, chosen = ROUNDS[what](module, size, rounds)
            times[name].append(us)
            seen.append(chosen)
        if any(s != seen[0] for s in seen):
            raise AssertionError(f"the batchers chose different batches at {size} pending")
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--what", default="batcher,expiry")
    p.add_argument("--sizes", default="32,512,4096", help="items pending / jobs held")
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tree", type=Path, help="another checkout, beside this one")
    args = p.parse_args()
    trees = {"this": REPO} | ({"tree": args.tree} if args.tree else {})
    for what in args.what.split(","):
        unit = {"batcher": "µs a batch", "expiry": "µs a pass"}.get(what, "µs in all")
        print(f"\n{what}\n\n| size | " + " | ".join(f"{n}: {unit}" for n in trees) + " |")
        print("|---|" + "---|" * len(trees))
        for size in (int(x) for x in args.sizes.split(",")):
            medians = compare(what, trees, size, args.rounds, args.repeat)
            print(f"| {size} | " + " | ".join(f"{medians[n]:.2f}" for n in trees) + " |")


if __name__ == "__main__":
    main()
