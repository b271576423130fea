"""The measurement plan: which system, which corpus, which load, in which order.

Every row is a dict with `system`, `corpus`, `mode` (closed | open | ceiling-1 |
ceiling-batch | frontend) and `load` (clients, or a fraction of inferq's capacity), plus
the numbers. One call of `run_once` measures everything once; repeats are medians of rows.
Corpora are grouped by the model they are measured with (`corpus.MODELS`): each server is
started once per model and measured on that model's corpora (`systems.SERVES` says which
server serves which model). The `echo` corpus has no ceiling and no open loop: it measures
inferq's path (infer and jobs) beside the floors, closed loop only.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from inferq.bench import corpus, inputs, load, stats, systems
from inferq.bench.procs import BenchError, bench_env, reset_tree_peak, tree_peak_rss_mb

Row = dict[str, Any]
OPEN_FRACTIONS = (0.5, 0.9)
FRONTEND_CLIENTS = 64
# Started in this order, once per model they serve.
SERVED = ("seed", "inferq", "litserve", "infinity", "infinity-optimum", *systems.FLOORS)


@dataclass(frozen=True)
class Plan:
    corpora: tuple[str, ...]
    concurrency: tuple[int, ...]
    duration_s: float
    warmup_s: float
    device: str
    backend: str
    systems: tuple[str, ...]  # ceiling, jobs, frontend and the names in SERVED
    env: tuple[tuple[str, str], ...] = ()  # extra env for every server (e.g. OMP_NUM_THREADS)

    def models(self) -> dict[str, list[str]]:
        """Model → its corpora in this plan, both in plan order."""
        out: dict[str, list[str]] = {}
        for c in self.corpora:
            out.setdefault(corpus.model_for(c), []).append(c)
        return out

    def served(self, model: str) -> list[str]:
        """The servers measured on `model`'s corpora (`systems.SERVES`)."""
        return [n for n in SERVED if n in self.systems and model in systems.SERVES[n]]

    def unserved(self, model: str) -> list[str]:
        """Requested servers that serve another model of this plan but not `model`
        (LitServe on images): each is skipped for `model` with a note."""
        others = set(self.models()) - {model}
        return [
            n
            for n in SERVED
            if n in self.systems
            and model not in systems.SERVES[n]
            and others & set(systems.SERVES[n])
        ]

    def idle(self) -> list[str]:
        """Requested servers that serve none of this plan's models (a floor without
        `--corpus echo`)."""
        models = set(self.models())
        return [n for n in SERVED if n in self.systems and not models & set(systems.SERVES[n])]

    def points(self) -> int:
        """Measured points in one run (for the progress bar)."""
        total = 0
        for model, corpora in self.models().items():
            served = self.served(model)
            echo = model == "echo"
            per_corpus = 1 if "ceiling" in self.systems and not echo else 0
            kinds = len(served) + ("inferq" in served) * sum(
                k in self.systems for k in ("jobs", "submit")
            )
            per_corpus += len(self.concurrency) * kinds
            per_corpus += len(OPEN_FRACTIONS) if "inferq" in served and not echo else 0
            total += per_corpus * len(corpora)
        return total + (2 if "frontend" in self.systems else 0)


class Runner:
    def __init__(self, plan: Plan, log_dir: Path, tick: Callable[[str], None]) -> None:
        self.plan, self.log_dir, self.tick = plan, log_dir, tick
        self.inputs = {c: inputs.load(c) for c in plan.corpora}
        self.rows: list[Row] = []

    # --- one point ---
    def _closed(self, target: load.Target, c: str, clients: int) -> load.LoadResult:
        inp = self.inputs[c]
        return asyncio.run(
            load.closed_loop(
                target, inp.bodies, inp.costs, clients, self.plan.duration_s, self.plan.warmup_s
            )
        )

    def _row(
        self, system: str, c: str, mode: str, load_: Any, res: load.LoadResult, run: systems.Running
    ) -> Row:
        row: Row = {"system": system, "corpus": c, "mode": mode, "load": load_}
        row |= stats.summarize(res.latencies_ms, res.duration_s, res.errors)
        row["mean_batch"] = statistics.fmean(res.batch_sizes) if res.batch_sizes else math.nan
        row["padding_eff"] = math.nan
        row["run_ms"] = math.nan
        return row

    def _measure(
        self,
        run: systems.Running,
        system: str,
        c: str,
        mode: str,
        load_: Any,
        go: Callable[[], load.LoadResult],
    ) -> Row:
        mark = run.worker.log_size() if run.worker else 0
        res = go()
        row = self._row(system, c, mode, load_, res, run)
        if run.worker is not None and res.latencies_ms:
            blog = stats.parse_batch_log(run.worker.read_log(mark))
            real_per_item = res.real_tokens / len(res.latencies_ms)
            row["padding_eff"] = stats.padding_efficiency(
                real_per_item * blog.items, blog.padded_tokens
            )
            row["run_ms"] = blog.run_ms_mean
            row["batches_mean_items"] = blog.mean_batch
        self.rows.append(row)
        self.tick(f"{system} {c} {mode} {load_}")
        return row

    # --- systems ---
    def ceiling(self, c: str) -> None:
        env = bench_env(
            BENCH_DEVICE=self.plan.device, BENCH_BACKEND=self.plan.backend, **dict(self.plan.env)
        )
        argv = [sys.executable, "-m", "inferq.bench.ceiling", c, str(self.plan.duration_s)]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise BenchError(f"ceiling failed:\n{out.stderr[-3000:]}")
        for r in json.loads(out.stdout.strip().splitlines()[-1]):
            self.rows.append(
                {
                    "system": "ceiling",
                    "corpus": c,
                    "load": 1 if r["mode"] == "ceiling-1" else "best",
                    **r,
                }
            )
        self.tick(f"ceiling {c}")

    def served(
        self, name: str, run: systems.Running, kinds: list[tuple[str, str]], corpora: list[str]
    ) -> None:
        """Closed-loop points for each (system label, request kind) against one running stack,
        on each of `corpora`; the peak memory of the process holding the model per corpus."""
        for c in corpora:
            reset_tree_peak(run.mem_pid)
            start = len(self.rows)
            for label, kind in kinds:
                target = replace(run.target, kind=kind)
                for n in self.plan.concurrency:

                    def go(t: load.Target = target, n: int = n, c: str = c) -> load.LoadResult:
                        return self._closed(t, c, n)

                    row = self._measure(run, label, c, "closed", n, go)
                    if run.agreement is not None:
                        row["min_cosine"] = run.agreement
            if name == "inferq" and c not in corpus.ECHO_CORPORA:
                self._open(run, c)
            peak = tree_peak_rss_mb(run.mem_pid)
            for row in self.rows[start:]:
                row["peak_mem_mb"] = peak

    def _open(self, run: systems.Running, c: str) -> None:
        closed = [
            r
            for r in self.rows
            if r["system"] == "inferq" and r["corpus"] == c and r["mode"] == "closed"
        ]
        capacity = max((r["items_per_s"] for r in closed), default=0.0)
        inp = self.inputs[c]
        for frac in OPEN_FRACTIONS:
            rate = max(capacity * frac, 1.0)

            def go(rate: float = rate) -> load.LoadResult:
                return asyncio.run(
                    load.open_loop(run.target, inp.bodies, inp.costs, rate, self.plan.duration_s)
                )

            row = self._measure(run, "inferq", c, "open", f"{frac:.0%}", go)
            row["rate_per_s"] = rate

    def frontend(self) -> None:
        """echo at zero delay, 1 then 2 API processes on one Redis: submit → result jobs/s."""
        run = systems.inferq(
            self.log_dir, "cpu", "torch", dict(self.plan.env), model="echo", apis=2
        )
        try:
            texts, tokens = ["hello world"] * 16, [4] * 16
            for n_api in (1, 2):
                target = replace(run.target, bases=run.target.bases[:n_api])
                res = asyncio.run(
                    load.closed_loop(
                        target,
                        texts,
                        tokens,
                        FRONTEND_CLIENTS,
                        self.plan.duration_s,
                        self.plan.warmup_s,
                    )
                )
                row = self._row("inferq-echo", "-", "frontend", f"{n_api} api", res, run)
                self.rows.append(row)
                self.tick(f"frontend {n_api} api")
        finally:
            run.close()


def _start(name: str, plan: Plan, log_dir: Path, model: str) -> systems.Running:
    env = dict(plan.env)
    if name in systems.FLOORS:
        return systems.floor(log_dir, name, env)
    if name.startswith("infinity"):
        return systems.infinity(log_dir, name, plan.device, env)
    if name == "seed":
        return systems.seed(log_dir, plan.device, plan.backend, env, model)
    if name == "litserve":
        return systems.litserve(log_dir, plan.device, plan.backend, env, model)
    return systems.inferq(log_dir, plan.device, plan.backend, env, model=model)


def run_once(
    plan: Plan, log_dir: Path, tick: Callable[[str], None], warn: Callable[[str], None]
) -> list[Row]:
    """Everything in `plan`, once, in a fixed order; a system that fails to start is skipped."""
    log_dir.mkdir(parents=True, exist_ok=True)
    r = Runner(plan, log_dir, tick)
    if "ceiling" in plan.systems:
        for c in plan.corpora:
            if c not in corpus.ECHO_CORPORA:  # echo measures the path: there is no model
                r.ceiling(c)
    for model, corpora in plan.models().items():
        for name in plan.unserved(model):
            only = ", ".join(systems.SERVES[name])
            warn(f"skipping {name} for {', '.join(corpora)}: it serves {only} only")
        for name in plan.served(model):
            try:
                run = _start(name, plan, log_dir, model)
            except (BenchError, ImportError, OSError) as e:
                warn(f"skipping {name} ({model}): {e}")
                continue
            kinds: list[tuple[str, str]] = (
                [("inferq", "infer")]
                + ([("inferq-jobs", "jobs")] if "jobs" in plan.systems else [])
                + ([("inferq-submit", "submit")] if "submit" in plan.systems else [])
                if name == "inferq"
                else [(name, run.target.kind)]
            )
            try:
                r.served(name, run, kinds, corpora)
            finally:
                run.close()
    if "frontend" in plan.systems:
        r.frontend()
    return r.rows
