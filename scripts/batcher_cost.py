"""The batch policy's own cost: µs a batch with N items pending, for this checkout's batcher
and, with `--tree`, another checkout's, side by side in one run and alternated.

Each round adds 32 items (one 32-input job, costs drawn from 10-40 tokens, seeded) and takes
one batch of 32, so the pending set stays at N: the steady state of a worker with N items
held (`INFERQ_PREFETCH` x clients). Both batchers see the same items and must choose the
same batches (checked on every round), so the figures compare the same work.

Run: .venv/bin/python scripts/batcher_cost.py [--pending 32,256,1024,4096] [--rounds 2000]
     [--tree /tmp/before]   # git worktree add /tmp/before <commit>
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BATCH = 32


def load(tree: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, tree / "worker/policy/batcher.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def _give(batcher: Any, items: list[Any]) -> None:
    if hasattr(batcher, "extend"):
        batcher.extend(items)
    else:  # an older batcher: one add an item
        for it in items:
            batcher.add(it)


def run(module: ModuleType, pending: int, rounds: int, seed: int = 1) -> tuple[float, list[Any]]:
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


def compare(trees: dict[str, Path], pending: int, rounds: int, repeat: int) -> dict[str, float]:
    """Median µs a round for each tree, alternated; raises if their batches differ."""
    modules = {name: load(tree, f"batcher_{name}") for name, tree in trees.items()}
    times: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(repeat):
        seen = []
        for name, module in modules.items():
            us, chosen = run(module, pending, rounds)
            times[name].append(us)
            seen.append(chosen)
        if any(s != seen[0] for s in seen):
            raise AssertionError(f"the batchers chose different batches at {pending} pending")
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pending", default="32,256,1024,4096")
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tree", type=Path, help="another checkout's batcher, beside this one")
    args = p.parse_args()
    trees = {"this": REPO} | ({"tree": args.tree} if args.tree else {})
    print("| pending | " + " | ".join(f"{n}: µs a batch" for n in trees) + " |")
    print("|---|" + "---|" * len(trees))
    for pending in (int(x) for x in args.pending.split(",")):
        medians = compare(trees, pending, args.rounds, args.repeat)
        print(f"| {pending} | " + " | ".join(f"{medians[n]:.1f}" for n in trees) + " |")


if __name__ == "__main__":
    main()
