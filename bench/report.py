"""The Markdown table, the targets check and the plot, from (median) rows."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from inferq.bench.corpus import ECHO_CORPORA, IMAGE_CORPORA
from inferq.bench.infinity import MIN_COSINE

Row = dict[str, Any]
COLUMNS = (
    ("items/s", "items_per_s", "{:.0f}"),
    ("p50 ms", "p50_ms", "{:.1f}"),
    ("p95 ms", "p95_ms", "{:.1f}"),
    ("p99 ms", "p99_ms", "{:.1f}"),
    ("errors", "errors", "{:.0f}"),
    ("peak MiB", "peak_mem_mb", "{:.0f}"),
    ("mean batch", "mean_batch", "{:.1f}"),
    ("pad eff", "padding_eff", "{:.2f}"),
)
MAX_WAIT_MS = 0.0  # inferq's INFERQ_MAX_WAIT_MS default, for the p99 bound
FLOOR = "floor-redis"  # the echo path's cost is shown against this floor's p50


def fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return spec.format(value) if isinstance(value, int | float) else str(value)


def table(rows: Sequence[Row]) -> str:
    """One Markdown table: system, mode, load, then COLUMNS."""
    head = ["system", "mode", "load", *(c[0] for c in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        load = f"{r['load']}: {r['layout']}" if r.get("layout") else str(r["load"])
        cells = [str(r["system"]), str(r["mode"]), load]
        cells += [fmt(r.get(key), spec) for _, key, spec in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def find(rows: Sequence[Row], **match: Any) -> Row | None:
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def _get(rows: Sequence[Row], field: str, **match: Any) -> float:
    r = find(rows, **match)
    v = r.get(field) if r else None
    return float(v) if isinstance(v, int | float) else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


Check = Callable[[str, float, bool | None, str], None]


def _text_targets(rows: Sequence[Row], c: str, clients: int, check: Check) -> None:
    iq = _get(rows, "items_per_s", system="inferq", corpus=c, mode="closed", load=clients)
    ceil = _get(rows, "items_per_s", system="ceiling", corpus=c, mode="ceiling-batch")
    lit = _get(rows, "items_per_s", system="litserve", corpus=c, mode="closed", load=clients)
    seed = _get(rows, "items_per_s", system="seed", corpus=c, mode="closed", load=clients)
    check(
        f"{c}: inferq ÷ ceiling at {clients} clients (≥ 0.8)",
        _ratio(iq, ceil),
        _ratio(iq, ceil) >= 0.8,
        "{:.2f}",
    )
    check(
        f"{c}: inferq ÷ LitServe at {clients} clients (> 1)",
        _ratio(iq, lit),
        _ratio(iq, lit) > 1,
        "{:.2f}",
    )
    for peer in ("infinity", "infinity-optimum"):
        if find(rows, system=peer, corpus=c):
            other = _get(rows, "items_per_s", system=peer, corpus=c, mode="closed", load=clients)
            check(
                f"{c}: inferq ÷ {peer} at {clients} clients (report)",
                _ratio(iq, other),
                None,
                "{:.2f}",
            )
    need = 3.0 if c == "short" else None
    check(
        f"{c}: inferq ÷ seed at {clients} clients" + (" (> 3)" if need else " (report)"),
        _ratio(iq, seed),
        None if need is None else _ratio(iq, seed) > need,
        "{:.2f}",
    )
    for q, limit in (("p50", 1.0), ("p99", 3.0)):
        one = _get(rows, f"{q}_ms", system="inferq", corpus=c, mode="closed", load=1)
        model = _get(rows, f"{q}_ms", system="ceiling", corpus=c, mode="ceiling-1")
        check(
            f"{c}: queue overhead {q}, ms (≤ {limit:g})",
            one - model,
            one - model <= limit,
            "{:.1f}",
        )
    p99 = _get(rows, "p99_ms", system="inferq", corpus=c, mode="open", load="50%")
    run_ms = _get(rows, "run_ms", system="inferq", corpus=c, mode="open", load="50%")
    bound = MAX_WAIT_MS + 2 * run_ms + 5
    check(
        f"{c}: p99 at 50% load, ms (≤ {fmt(bound, '{:.1f}')} = wait + 2×batch + 5)",
        p99,
        p99 <= bound,
        "{:.1f}",
    )
    eff = _get(rows, "padding_eff", system="inferq", corpus=c, mode="closed", load=clients)
    check(f"{c}: inferq padding efficiency at {clients} clients (≥ 0.8)", eff, eff >= 0.8, "{:.2f}")


def _image_targets(rows: Sequence[Row], c: str, clients: int, check: Check) -> None:
    """The image issue's targets: ≥ 1.5× the seed pattern and ≥ 0.7× the batched ceiling at
    `clients`, and the worker's peak memory beside the seed process's (reported)."""
    iq = _get(rows, "items_per_s", system="inferq", corpus=c, mode="closed", load=clients)
    ceil = _get(rows, "items_per_s", system="ceiling", corpus=c, mode="ceiling-batch")
    seed = _get(rows, "items_per_s", system="seed", corpus=c, mode="closed", load=clients)
    check(
        f"{c}: inferq ÷ seed at {clients} clients (≥ 1.5)",
        _ratio(iq, seed),
        _ratio(iq, seed) >= 1.5,
        "{:.2f}",
    )
    check(
        f"{c}: inferq ÷ ceiling at {clients} clients (≥ 0.7)",
        _ratio(iq, ceil),
        _ratio(iq, ceil) >= 0.7,
        "{:.2f}",
    )
    for system, who in (("inferq", "inferq worker"), ("seed", "seed process")):
        mem = _get(rows, "peak_mem_mb", system=system, corpus=c, mode="closed", load=clients)
        check(f"{c}: {who} peak MiB (report)", mem, None, "{:.0f}")


def floor_ratios(rows: Sequence[Row], c: str, floor: str = FLOOR) -> list[Row]:
    """Each closed-loop point on corpus `c` beside `floor`'s at the same load: p50 ÷ the
    floor's p50 and items/s ÷ the floor's (nan where the floor has no point)."""
    closed = [r for r in rows if r.get("corpus") == c and r.get("mode") == "closed"]
    floors = {r["load"]: r for r in closed if r["system"] == floor}
    out = []
    for r in closed:
        if r["system"] == floor:
            continue
        f = floors.get(r["load"], {})
        fp50, fips = f.get("p50_ms", math.nan), f.get("items_per_s", math.nan)
        out.append(
            {
                "system": r["system"],
                "load": r["load"],
                "p50_ms": r.get("p50_ms"),
                "floor_p50_ms": fp50,
                "p50_ratio": _ratio(r.get("p50_ms", math.nan), fp50),
                "items_ratio": _ratio(r.get("items_per_s", math.nan), fips),
            }
        )
    return out


def floor_table(ratios: Sequence[Row], floor: str = FLOOR) -> str:
    head = ["system", "load", "p50 ms", f"{floor} p50 ms", "p50 ÷ floor", "items/s ÷ floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in ratios:
        cells = [str(r["system"]), str(r["load"]), fmt(r["p50_ms"], "{:.2f}"),
                 fmt(r["floor_p50_ms"], "{:.2f}"), fmt(r["p50_ratio"], "{:.1f}×"),
                 fmt(r["items_ratio"], "{:.2f}")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _echo_targets(rows: Sequence[Row], c: str, clients: int, check: Check) -> None:
    """The echo path's cost: inferq's p50 (sync and jobs) ÷ floor-redis's, reported."""
    for r in floor_ratios(rows, c):
        if r["system"] in ("inferq", "inferq-jobs") and r["load"] in (1, clients):
            n = r["load"]
            what = f"{c}: {r['system']} p50 ÷ {FLOOR} p50 at {n} client{'s' * (n != 1)} (report)"
            check(what, r["p50_ratio"], None, "{:.1f}×")


def targets(
    rows: Sequence[Row], corpora: Sequence[str], clients: int = 32
) -> list[tuple[str, str, str]]:
    """(what, measured, verdict) for each target of the issue that the rows can answer."""
    out: list[tuple[str, str, str]] = []

    def check(what: str, value: float, ok: bool | None, spec: str = "{:.2f}") -> None:
        verdict = "–" if ok is None or math.isnan(value) else ("met" if ok else "missed")
        out.append((what, fmt(value, spec), verdict))

    for c in corpora:
        if c in IMAGE_CORPORA:
            _image_targets(rows, c, clients, check)
        elif c in ECHO_CORPORA:
            _echo_targets(rows, c, clients, check)
        else:
            _text_targets(rows, c, clients, check)
    for peer in ("infinity", "infinity-optimum"):
        cos = _get(rows, "min_cosine", system=peer)
        if not math.isnan(cos):
            check(
                f"{peer}: min cosine against inferq's vectors (≥ {MIN_COSINE})",
                cos,
                cos >= MIN_COSINE,
                "{:.5f}",
            )
    if all(c in IMAGE_CORPORA for c in corpora) and corpora:
        return out  # an image run has no front-end points
    one = _get(rows, "items_per_s", mode="frontend", load="1 api")
    two = _get(rows, "items_per_s", mode="frontend", load="2 api")
    check("front end: echo jobs/s with 1 API", one, None, "{:.0f}")
    check("front end: echo jobs/s with 2 APIs", two, None, "{:.0f}")
    return out


def markdown(rows: Sequence[Row], corpora: Sequence[str], title: str, machine: str) -> str:
    parts = [f"### {title}", "", machine, ""]
    for c in corpora:
        parts += [f"#### corpus `{c}`", "", table([r for r in rows if r.get("corpus") == c]), ""]
        if c in ECHO_CORPORA and (ratios := floor_ratios(rows, c)):
            parts += [f"#### `{c}`: the path's cost against {FLOOR}", "", floor_table(ratios), ""]
    fe = [r for r in rows if r.get("mode") == "frontend"]
    if fe:
        parts += ["#### front end (echo model, zero delay)", "", table(fe), ""]
    parts += ["#### targets", "", "| target | measured | verdict |", "|---|---|---|"]
    parts += [f"| {a} | {b} | {v} |" for a, b, v in targets(rows, corpora)]
    return "\n".join(parts) + "\n"


def plot(rows: Sequence[Row], corpora: Sequence[str], paths: Sequence[Path]) -> None:
    """Throughput and p99 vs concurrency, one line per system, a row of panels per corpus."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(corpora), 2, figsize=(11, 3.6 * len(corpora)), squeeze=False)
    for (ax_t, ax_p), c in zip(axes, corpora, strict=True):
        closed = [r for r in rows if r.get("corpus") == c and r.get("mode") == "closed"]
        for system in dict.fromkeys(r["system"] for r in closed):
            pts = sorted((r["load"], r) for r in closed if r["system"] == system)
            xs = [p[0] for p in pts]
            ax_t.plot(xs, [p[1]["items_per_s"] for p in pts], marker="o", label=system)
            ax_p.plot(xs, [p[1]["p99_ms"] for p in pts], marker="o", label=system)
        ceil = find(rows, system="ceiling", corpus=c, mode="ceiling-batch")
        if ceil:
            ax_t.axhline(
                ceil["items_per_s"], linestyle="--", color="grey", label="ceiling (batched)"
            )
        ax_t.set(xscale="log", xlabel="clients", ylabel="items/s", title=f"{c}: throughput")
        ax_p.set(
            xscale="log", yscale="log", xlabel="clients", ylabel="p99 ms", title=f"{c}: p99 latency"
        )
        ax_t.legend(fontsize=8)
        ax_p.legend(fontsize=8)
    fig.tight_layout()
    for p in paths:
        fig.savefig(p, dpi=110)
    plt.close(fig)
