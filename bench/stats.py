"""Pure numbers: percentiles, per-point summaries, medians across repeats, padding."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# The worker's per-batch INFO line (worker/telemetry.py `Telemetry.on_batch`).
BATCH_LINE = re.compile(r"batch items=(\d+) tokens=(\d+)/\d+ run_ms=([\d.]+)")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation as numpy's default; nan if empty."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(latencies_ms: Sequence[float], duration_s: float, errors: int) -> dict[str, float]:
    """items/s and latency percentiles of one measured point (one item per request)."""
    return {
        "items_per_s": len(latencies_ms) / duration_s if duration_s > 0 else math.nan,
        "p50_ms": percentile(latencies_ms, 50),
        "p95_ms": percentile(latencies_ms, 95),
        "p99_ms": percentile(latencies_ms, 99),
        "n": float(len(latencies_ms)),
        "errors": float(errors),
    }


def padding_efficiency(real_tokens: float, padded_tokens: float) -> float:
    """Real tokens ÷ padded tokens (items × longest item, summed over batches)."""
    return real_tokens / padded_tokens if padded_tokens > 0 else math.nan


def sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Lengths sorted and cut into batches of `batch_size`: the ceiling's packing."""
    xs = sorted(lengths)
    return [xs[i : i + batch_size] for i in range(0, len(xs), batch_size)]


def packed_efficiency(batches: Iterable[Sequence[int]]) -> float:
    real = padded = 0
    for b in batches:
        real += sum(b)
        padded += len(b) * max(b)
    return padding_efficiency(real, padded)


@dataclass(frozen=True, slots=True)
class BatchLog:
    """What the worker's batch lines say over a window."""

    batches: int
    items: int
    padded_tokens: int
    run_ms_mean: float

    @property
    def mean_batch(self) -> float:
        return self.items / self.batches if self.batches else math.nan


def parse_batch_log(text: str) -> BatchLog:
    """Sum the worker's `batch items=.. tokens=../.. run_ms=..` lines in `text`."""
    rows = [(int(a), int(b), float(c)) for a, b, c in BATCH_LINE.findall(text)]
    run = statistics.fmean(r[2] for r in rows) if rows else math.nan
    return BatchLog(len(rows), sum(r[0] for r in rows), sum(r[1] for r in rows), run)


def _median(values: list[float]) -> float:
    vals = [v for v in values if isinstance(v, int | float) and not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def median_rows(
    runs: Sequence[Sequence[dict[str, Any]]], key: Sequence[str]
) -> list[dict[str, Any]]:
    """Rows matched across repeats by `key` fields; numeric fields become their median.

    Order follows the first run in which a key appears; `repeats` counts the runs seen.
    """
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rows in runs:
        for row in rows:
            groups.setdefault(tuple(row.get(k) for k in key), []).append(row)
    out = []
    for k, rows in groups.items():
        merged: dict[str, Any] = dict(zip(key, k, strict=True))
        for field in rows[0]:
            if field in merged:
                continue
            vals = [r.get(field) for r in rows]
            if all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
                merged[field] = _median([float(v) for v in vals])  # type: ignore[arg-type]
            else:
                merged[field] = rows[0][field]
        merged["repeats"] = len(rows)
        out.append(merged)
    return out
