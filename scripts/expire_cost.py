"""What the worker's expiry check costs a scheduling pass (`Book.expire_due`, called before
every batch is chosen) with N jobs held and none due: this checkout's book and, with
`--tree`, another checkout's, side by side in one run and alternated.

Run: .venv/bin/python scripts/expire_cost.py [--held 32,512,4096] [--passes 2000]
     [--tree /tmp/before]   # git worktree add /tmp/before <commit>
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from inferq.shared.jobs import Job, SystemClock
from inferq.shared.queue import Entry
from inferq.shared.settings import Settings
from inferq.worker.policy.batcher import Item
from inferq.worker.policy.scheduler import LiveCeiling, Scheduler
from inferq.worker.telemetry import Telemetry

REPO = Path(__file__).resolve().parents[1]
DEADLINE_MS = 60_000  # every job's: none comes due while timed


def load(tree: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, tree / "worker/book.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--held", default="32,512,4096")
    p.add_argument("--passes", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tree", type=Path, help="another checkout's book, beside this one")
    args = p.parse_args()
    trees = {"this": REPO} | ({"tree": args.tree} if args.tree else {})
    modules = {name: load(tree, f"book_{name}") for name, tree in trees.items()}
    print("| held jobs | " + " | ".join(f"{n}: µs a pass" for n in trees) + " |")
    print("|---|" + "---|" * len(trees))
    for held in (int(x) for x in args.held.split(",")):
        books = {name: held_book(m, held) for name, m in modules.items()}
        times: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.repeat):
            for name, book in books.items():
                times[name].append(per_pass(book, args.passes))
        medians = {name: statistics.median(t) for name, t in times.items()}
        print(f"| {held} | " + " | ".join(f"{medians[n]:.2f}" for n in trees) + " |")


if __name__ == "__main__":
    main()
