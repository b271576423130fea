"""`inferq bench`: inferq beside the model alone, the seed pattern and LitServe, one run.

See bench/ for the parts and docs/benchmarks.md for what each number means.
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Results go under the working directory, never beside the installed package: a source
# checkout keeps them in bench/results and refreshes docs/benchmarks.md; elsewhere they land in
# ./inferq-bench-results and no docs are written.
IN_CHECKOUT = Path("bench/main.py").is_file() and Path("docs/benchmarks.md").is_file()
DEFAULT_OUT = "bench/results" if IN_CHECKOUT else "inferq-bench-results"
DEFAULT_DOCS = "docs" if IN_CHECKOUT else ""
ALL_SYSTEMS = "ceiling,seed,inferq,jobs,litserve,frontend"


@dataclass(frozen=True)
class BenchOptions:
    """What `inferq bench` measures (its command-line options, see `inferq bench --help`)."""

    corpus: str = "short,mixed"  # comma-separated: short, mixed
    concurrency: str = "1,8,32,128"  # closed-loop client counts
    duration: float = 6.0  # measured seconds per point
    warmup: float = 1.0  # unmeasured seconds before each point
    device: str = "cpu"
    backend: str = "torch"
    repeat: int = 1  # runs; the table shows medians
    systems: str = ALL_SYSTEMS
    env: tuple[str, ...] = ()  # KEY=VALUE for every server process
    quick: bool = False  # smoke run: 1,8,32 clients, 2 s points
    out: str = DEFAULT_OUT
    docs: str = DEFAULT_DOCS  # where benchmarks.md/png go ('' = skip)


def machine() -> str:
    """One line: cores, CPU model, RAM, Python (what docs/benchmarks.md says it ran on)."""
    import os

    cpu = "unknown CPU"
    mem_kb = 0
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
    except (OSError, StopIteration):
        pass
    return (f"Machine: {os.cpu_count()} cores (`nproc`), {cpu}, {mem_kb / 2**20:.1f} GiB RAM, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}.")  # fmt: skip


def _onnx_ok(backend: str) -> str | None:
    if backend != "onnx":
        return None
    try:
        import inferq.worker.models.minilm_onnx  # noqa: F401
    except ImportError as e:
        return f"--backend onnx: inferq.worker.models.minilm_onnx does not import ({e}); skipped"
    return None


def main(args: BenchOptions, argv: list[str]) -> int:
    """Run the plan `args` describes; `argv` (the command line) goes into the report's title."""
    if bad := [kv for kv in args.env if "=" not in kv]:
        print(f"inferq bench: --env wants KEY=VALUE, got {bad}", file=sys.stderr)
        return 2
    from tqdm import tqdm

    from inferq.bench import report, stats
    from inferq.bench.runner import Plan, run_once

    if (msg := _onnx_ok(args.backend)) is not None:
        print(msg, file=sys.stderr)
        return 0
    conc = "1,8,32" if args.quick and args.concurrency == "1,8,32,128" else args.concurrency
    plan = Plan(
        corpora=tuple(c for c in args.corpus.split(",") if c),
        concurrency=tuple(int(n) for n in conc.split(",") if n),
        duration_s=2.0 if args.quick else args.duration,
        warmup_s=0.5 if args.quick else args.warmup,
        device=args.device,
        backend=args.backend,
        systems=tuple(s for s in args.systems.split(",") if s),
        env=tuple(tuple(kv.split("=", 1)) for kv in args.env),  # type: ignore[misc]
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[list[dict[str, Any]]] = []
    with (
        tempfile.TemporaryDirectory(prefix="inferq-bench-") as tmp,
        tqdm(total=plan.points() * args.repeat, unit="pt", dynamic_ncols=True) as bar,
    ):
        for i in range(args.repeat):

            def tick(what: str, i: int = i) -> None:
                bar.set_postfix_str(f"run {i + 1}: {what}")
                bar.update(1)

            runs.append(
                run_once(
                    plan, Path(tmp) / f"run{i}", tick, lambda m: tqdm.write(m, file=sys.stderr)
                )
            )
    rows = stats.median_rows(runs, ("system", "corpus", "mode", "load"))
    title = (f"`inferq bench` {' '.join(argv)} — {args.device}, {args.backend}, "
             f"median of {args.repeat} run(s), {stamp}")  # fmt: skip
    md = report.markdown(rows, plan.corpora, title, machine())
    result = {
        "stamp": stamp,
        "argv": argv,
        "machine": machine(),
        "plan": plan.__dict__,
        "median": rows,
        "runs": runs,
    }
    (out / f"{stamp}.json").write_text(json.dumps(result, indent=1, default=str))
    pngs = [out / f"{stamp}.png"]
    if args.docs:
        docs = Path(args.docs)
        docs.mkdir(parents=True, exist_ok=True)
        pngs.append(docs / "benchmarks.png")
        _write_docs(docs / "benchmarks.md", md)
    report.plot(rows, plan.corpora, pngs)
    print(md)
    print(f"results: {out / stamp}.json, {out / stamp}.png")
    return 0


MARK = "<!-- inferq bench: latest run -->"


def _write_docs(path: Path, md: str) -> None:
    """Replace everything after MARK in docs/benchmarks.md (the prose above it stays)."""
    head = path.read_text().split(MARK)[0] if path.is_file() else "# Benchmarks\n\n"
    path.write_text(head.rstrip("\n") + "\n\n" + MARK + "\n\n" + md)
