"""`inferq bench`: inferq beside the model alone, the seed pattern, LitServe and Infinity, and
inferq's echo path beside the floors (`--corpus echo`), one run.

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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferq.bench.runner import Plan  # imported where used: it pulls in redis

# Results go under the working directory, never beside the installed package: a source
# checkout keeps them in bench/results and refreshes docs/benchmarks.md; elsewhere they land in
# ./inferq-bench-results and no docs are written.
IN_CHECKOUT = Path("bench/main.py").is_file() and Path("docs/benchmarks.md").is_file()
DEFAULT_OUT = "bench/results" if IN_CHECKOUT else "inferq-bench-results"
DEFAULT_DOCS = "docs" if IN_CHECKOUT else ""
# infinity-optimum is not in the default run: it is the peer of `--backend onnx`.
ALL_SYSTEMS = "ceiling,seed,inferq,jobs,litserve,infinity,frontend,floor-fastapi,floor-redis"
# What `--systems` takes: the served systems (runner.SERVED) and these four.
PSEUDO_SYSTEMS = ("ceiling", "jobs", "submit", "frontend")


@dataclass(frozen=True)
class BenchOptions:
    """What `inferq bench` measures (its command-line options, see `inferq bench --help`)."""

    corpus: str = "short,mixed"  # comma-separated: short, mixed, images, echo
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
    return (
        f"Machine: {os.cpu_count()} cores (`nproc`), {cpu}, {mem_kb / 2**20:.1f} GiB RAM, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}."
    )


def _onnx_ok(backend: str) -> str | None:
    if backend != "onnx":
        return None
    try:
        import inferq.worker.models.minilm_onnx  # noqa: F401
    except ImportError as e:
        return f"--backend onnx: inferq.worker.models.minilm_onnx does not import ({e}); skipped"
    return None


def plan_from(args: BenchOptions) -> Plan:
    """The measurement plan the options describe; ValueError naming what is off."""
    from inferq.bench import corpus
    from inferq.bench.runner import SERVED, Plan

    if bad := [kv for kv in args.env if "=" not in kv]:
        raise ValueError(f"--env wants KEY=VALUE, got {bad}")
    corpora = tuple(c for c in args.corpus.split(",") if c)
    for c in corpora:
        corpus.model_for(c)  # raises for an unknown name
    if not corpora:
        raise ValueError("--corpus names no corpus")
    known = (*PSEUDO_SYSTEMS, *SERVED)
    if bad := [s for s in args.systems.split(",") if s and s not in known]:
        raise ValueError(f"unknown system(s) {bad}: want some of {', '.join(known)}")
    conc = "1,8,32" if args.quick and args.concurrency == "1,8,32,128" else args.concurrency
    return Plan(
        corpora=corpora,
        concurrency=tuple(int(n) for n in conc.split(",") if n),
        duration_s=2.0 if args.quick else args.duration,
        warmup_s=0.5 if args.quick else args.warmup,
        device=args.device,
        backend=args.backend,
        systems=tuple(s for s in args.systems.split(",") if s),
        env=tuple(tuple(kv.split("=", 1)) for kv in args.env),  # type: ignore[misc]
    )


def idle_notes(args: BenchOptions, plan: Plan) -> list[str]:
    """Why a system named in --systems will not run (none of its corpora asked for); nothing
    for the default set, whose floors only run with --corpus echo."""
    if args.systems == ALL_SYSTEMS:
        return []
    from inferq.bench.corpus import MODELS
    from inferq.bench.systems import SERVES

    notes = []
    for name in plan.idle():
        wants = ",".join(c for c, m in MODELS.items() if m in SERVES[name])
        notes.append(f"{name} is not run: it measures --corpus {wants} only")
    return notes


def _images_ok(corpora: tuple[str, ...]) -> str | None:
    if "images" not in corpora:
        return None
    try:
        import PIL  # noqa: F401
        import skimage  # noqa: F401
    except ImportError as e:
        return f"--corpus images builds its photos with scikit-image and Pillow: {e}"
    return None


def main(args: BenchOptions, argv: list[str]) -> int:
    """Run the plan `args` describes; `argv` (the command line) goes into the report's title."""
    try:
        plan = plan_from(args)
    except ValueError as e:
        print(f"inferq bench: {e}", file=sys.stderr)
        return 2
    if (msg := _images_ok(plan.corpora)) is not None:
        print(f"inferq bench: {msg}", file=sys.stderr)
        return 2
    if (msg := _onnx_ok(args.backend)) is not None:
        print(msg, file=sys.stderr)
        return 0
    for note in idle_notes(args, plan):
        print(f"inferq bench: {note}", file=sys.stderr)
    from tqdm import tqdm

    from inferq.bench import stats
    from inferq.bench.runner import run_once

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
    title = (
        f"`inferq bench` {' '.join(argv)} — {args.device}, {args.backend}, "
        f"median of {args.repeat} run(s), {stamp}"
    )
    result = {
        "stamp": stamp,
        "argv": argv,
        "machine": machine(),
        "plan": plan.__dict__,
        "median": rows,
        "runs": runs,
    }
    (out / f"{stamp}.json").write_text(json.dumps(result, indent=1, default=str))
    pngs = _report(rows, plan.corpora, title, out / stamp, Path(args.docs) if args.docs else None)
    print(f"results: {', '.join(str(p) for p in [out / f'{stamp}.json', *pngs])}")
    return 0


def _report(
    rows: list[dict[str, Any]], corpora: tuple[str, ...], title: str, stem: Path, docs: Path | None
) -> list[Path]:
    """Print the tables, draw the plots, refresh the docs: text corpora and images apart, each
    with its own section of docs/benchmarks.md and its own plot, so a run of one never
    overwrites the other's. A missing matplotlib costs the plot only."""
    from inferq.bench import report
    from inferq.bench.corpus import IMAGE_CORPORA

    def part(images: bool) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
        return (
            tuple(c for c in corpora if (c in IMAGE_CORPORA) == images),
            [r for r in rows if (r.get("corpus") in IMAGE_CORPORA) == images],
        )

    sections = [
        (*part(False), title, stem.with_suffix(".png"), "benchmarks.png", _write_docs),
        (*part(True), f"{title} — efficientnet-lite0", stem.parent / f"{stem.name}-images.png",
         IMAGE_PNG, _write_image_docs),
    ]  # fmt: skip
    plotted: list[Path] = []
    for names, part_rows, head, png, doc_png, write in sections:
        if not names:
            continue
        md = report.markdown(part_rows, names, head, machine())
        print(md)
        pngs = [png] + ([docs / doc_png] if docs is not None else [])
        if docs is not None:
            docs.mkdir(parents=True, exist_ok=True)
        try:
            report.plot(part_rows, names, pngs)
            plotted.append(png)
        except ImportError as e:
            print(f"inferq bench: no plot ({e}; it needs matplotlib)", file=sys.stderr)
            pngs = []
        if docs is not None:
            if write is _write_image_docs and pngs:
                md += f"\n![images: throughput and p99 vs clients]({doc_png})\n"
            write(docs / "benchmarks.md", md)
    return plotted


MARK = "<!-- inferq bench: latest run -->"
# The image run's own section, kept above MARK: a text run replaces everything after MARK.
IMAGE_MARK = "<!-- inferq bench: images -->"
IMAGE_END = "<!-- inferq bench: images end -->"
IMAGE_PNG = "benchmarks-images.png"


def _write_docs(path: Path, md: str) -> None:
    """Replace everything after MARK in docs/benchmarks.md (the prose above it stays)."""
    head = path.read_text() if path.is_file() else "# Benchmarks\n\n"
    head = head.split(MARK)[0]
    path.write_text(head.rstrip("\n") + "\n\n" + MARK + "\n\n" + md)


def _write_image_docs(path: Path, md: str) -> None:
    """Replace what lies between IMAGE_MARK and IMAGE_END (made above MARK if missing)."""
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    block = f"{IMAGE_MARK}\n\n{md.strip()}\n\n{IMAGE_END}"
    if IMAGE_MARK in text and IMAGE_END in text.split(IMAGE_MARK, 1)[1]:
        before, rest = text.split(IMAGE_MARK, 1)
        text = before + block + rest.split(IMAGE_END, 1)[1]
    elif MARK in text:
        before, after = text.split(MARK, 1)
        text = before + block + "\n\n" + MARK + after
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
