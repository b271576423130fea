"""The memory bound's arithmetic and its file: fit, budget, ceiling, stored calibration.

Pure functions and the JSON file under `<data_dir>/calibration/`; nothing here touches a
device (probing is `inferq.worker.calibration.probe`). The budget is the worker's device
footprint, what nvidia-smi shows for its process: the CUDA context, the weights and whatever
the allocator keeps reserved. The calibration fits the allocator's peak *reserved* memory
(weights included, in `base`) and measures the context beside it, so at start
(`resolve_ceiling`):

    share   = budget ÷ INFERQ_WORKERS_PER_DEVICE                   (workers on one device split it)
    ceiling = margin × (share − context − base) / per_unit       (margin 0.9 by default)

never below the model's `max_cost` (one largest item must always fit), and overridden by
an explicitly set `INFERQ_MAX_BATCH_TOKENS`. The allocator itself is capped at
`share − context` (`allocator_fraction`), so an estimate that is off becomes a caught
out-of-memory and a split inside the share, never memory taken from a neighbour.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

log = logging.getLogger("inferq.worker")

DEFAULT_MARGIN = 0.9
#: The knee: the padded size past which tokens/s grows by less than this fraction.
KNEE_GAIN = 0.05
DEFAULT_BUDGET = "0.8"  # when neither --budget nor INFERQ_MEMORY_BUDGET is given
# 2: the fit is over peak reserved memory and `context_bytes` is measured beside it. A version
# 1 file (peak allocated, no context) still reads, with a context of 0.
FILE_VERSION = 2
_READABLE_VERSIONS = (1, FILE_VERSION)

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*|%)\s*$")


def parse_budget(text: str, device_total_bytes: int | None) -> int:
    """Bytes from '6GiB', '512MiB', '1.5GB', '2000000000', or a fraction '0.8' / '80%'.

    A bare number ≤ 1 is a fraction of `device_total_bytes`; a bare number > 1 must be
    whole bytes. Raises ValueError naming the text otherwise.
    """
    m = _BUDGET.match(text)
    if not m or m.group(2).lower() not in {*_UNITS, "%"}:
        raise ValueError(
            f"memory budget {text!r}: want bytes ('6GiB', '512MiB', '1.5GB', '2000000000') "
            "or a fraction of the device ('0.8', '80%')"
        )
    number, unit = float(m.group(1)), m.group(2).lower()
    fraction = number / 100 if unit == "%" else number if unit == "" and number <= 1 else None
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise ValueError(f"memory budget {text!r}: a fraction must be in (0, 1]")
        if device_total_bytes is None:
            raise ValueError(
                f"memory budget {text!r} is a fraction but the device total is unknown"
            )
        return int(fraction * device_total_bytes)
    if unit == "" and not number.is_integer():
        raise ValueError(f"memory budget {text!r}: bytes must be whole, or give a unit ('1.5GB')")
    value = int(number * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"memory budget {text!r} must be positive")
    return value


@dataclass(frozen=True, slots=True)
class Fit:
    """memory ≈ base_bytes + per_token_bytes × padded_tokens, and how well that holds."""

    base_bytes: float
    per_token_bytes: float
    r2: float
    max_rel_err: float  # max |predicted − measured| / measured over the points
    n: int

    def predict(self, tokens: int) -> float:
        return self.base_bytes + self.per_token_bytes * tokens


def fit_memory(points: Sequence[tuple[int, int]]) -> Fit:
    """Least-squares line through (padded_tokens, peak_bytes); needs two distinct sizes."""
    xs = [float(t) for t, _ in points]
    ys = [float(b) for _, b in points]
    if len(set(xs)) < 2:
        raise ValueError(f"need probes of at least two sizes to fit, got {sorted(set(xs))}")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    base = my - slope * mx
    residuals = [y - (base + slope * x) for x, y in zip(xs, ys, strict=True)]
    ss_tot = sum((y - my) ** 2 for y in ys)
    r2 = 1.0 - sum(r * r for r in residuals) / ss_tot if ss_tot else 1.0
    rel = max(abs(r) / y for r, y in zip(residuals, ys, strict=True) if y > 0)
    return Fit(base, slope, r2, rel, len(points))


def ceiling_for_budget(
    fit: Fit, budget_bytes: int, margin: float = DEFAULT_MARGIN, *, min_tokens: int = 1
) -> int:
    """Padded tokens that fit: margin × (budget − base) / per_token, at least `min_tokens`.

    Raises ValueError when the fit has no positive slope (memory did not grow with the
    batch, as for the echo model): such a fit bounds nothing.
    """
    if not fit.per_token_bytes > 0:
        raise ValueError(
            f"memory did not grow with batch size (per_token={fit.per_token_bytes:.1f} B): no bound"
        )
    raw = margin * (budget_bytes - fit.base_bytes) / fit.per_token_bytes
    return max(min_tokens, math.floor(raw))


def device_share(budget_bytes: int, workers: int) -> int:
    """One worker's part of a device budget that `workers` processes on the device split."""
    if workers < 1:
        raise ValueError(f"workers per device must be at least 1, got {workers}")
    return budget_bytes // workers


def allocator_fraction(share_bytes: int, context_bytes: int, total_bytes: int) -> float:
    """The cap for torch's caching allocator (`set_per_process_memory_fraction`): what it may
    reserve is the worker's share less the CUDA context, which the allocator never sees.
    Raises ValueError when the share does not even hold the context."""
    room = share_bytes - context_bytes
    if room <= 0 or total_bytes <= 0:
        raise ValueError(
            f"a device share of {fmt_bytes(share_bytes)} leaves nothing past the CUDA context "
            f"({fmt_bytes(context_bytes)}): raise INFERQ_MEMORY_BUDGET or run fewer workers"
        )
    return min(1.0, room / total_bytes)


def latency_knee(points: Sequence[tuple[int, float]], gain: float = KNEE_GAIN) -> int:
    """The padded size past which throughput stops growing by more than `gain`.

    `points` are (padded_tokens, latency_s). Throughput is tokens/s, which at a fixed
    item length is items/s × length, so sizes of different lengths compare. The knee is
    the smallest size whose best throughput so far is within `gain` of every larger size's.
    """
    if not points:
        raise ValueError("no points")
    best: dict[int, float] = {}
    for tokens, latency_s in points:
        best[tokens] = max(best.get(tokens, 0.0), tokens / max(latency_s, 1e-9))
    sizes = sorted(best)
    rates = [best[s] for s in sizes]
    running = 0.0
    for i, size in enumerate(sizes):
        running = max(running, rates[i])
        if all(r <= running * (1 + gain) for r in rates[i + 1 :]):
            return size
    return sizes[-1]  # unreachable: the last size always qualifies


@dataclass(slots=True)
class Probe:
    batch_size: int
    length: int
    padded_tokens: int
    peak_bytes: int | None
    latency_s: float
    oom: bool = False

    @property
    def items_per_s(self) -> float:
        return self.batch_size / self.latency_s if self.latency_s > 0 else 0.0


@dataclass(slots=True)
class Calibration:
    model: str
    backend: str
    device: str
    memory_source: str
    fit: Fit
    margin: float
    budget_bytes: int | None
    ceiling_tokens: int | None
    knee_tokens: int
    max_cost: int | None
    device_total_bytes: int
    load_peak_bytes: int | None
    steady_bytes: int | None
    probes: list[Probe] = field(default_factory=list)
    created_at: str = ""
    version: int = FILE_VERSION
    # The device memory the process holds beyond what the allocator reserves (the CUDA
    # context, cuBLAS workspaces): 0 on a CPU, where the RSS the fit measures holds it all.
    context_bytes: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        raw = json.loads(text)
        if raw.get("version") not in _READABLE_VERSIONS:
            raise ValueError(
                f"calibration file version {raw.get('version')!r} not in {_READABLE_VERSIONS}"
            )
        raw["fit"] = Fit(**raw["fit"])
        raw["probes"] = [Probe(**p) for p in raw["probes"]]
        return cls(**raw)


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", part)


def backend_key(settings: Any) -> str:
    """What the calibration is keyed by besides model and device: the runtime and precision."""
    if settings.backend == "onnx":
        return "onnx" if settings.onnx_variant == "fp32" else f"onnx-{settings.onnx_variant}"
    # "auto" is resolved before a worker or a calibration names its file; unresolved it
    # counts as float32, what it means on a CPU.
    return "torch" if settings.dtype in ("float32", "auto") else f"torch-{settings.dtype}"


def calibration_path(data_dir: Path | str, model: str, backend: str, device: str) -> Path:
    name = f"{_safe(model)}-{_safe(backend)}-{_safe(device)}.json"
    return Path(data_dir) / "calibration" / name


def save_calibration(data_dir: Path | str, cal: Calibration) -> Path:
    path = calibration_path(data_dir, cal.model, cal.backend, cal.device)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(cal.to_json())
    os.replace(tmp, path)
    return path


def load_calibration(
    data_dir: Path | str, model: str, backend: str, device: str
) -> Calibration | None:
    """The stored calibration, or None if there is none (or it cannot be read: logged)."""
    path = calibration_path(data_dir, model, backend, device)
    try:
        return Calibration.from_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:
        log.warning("ignoring unreadable calibration %s: %s", path, e)
        return None


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.{1 if unit == 'GiB' else 0}f} {unit}"
    return f"{n:.0f} B"


def device_budget(
    settings: Any, cal: Calibration | None, total_bytes: int | None
) -> tuple[int, str] | None:
    """The device budget in bytes (for all the workers on the device) and where it came
    from: INFERQ_MEMORY_BUDGET, else the calibration's; None when neither gives one."""
    if settings.memory_budget:
        budget = parse_budget(settings.memory_budget, total_bytes)
        return budget, f"INFERQ_MEMORY_BUDGET={settings.memory_budget} = {fmt_bytes(budget)}"
    if cal is not None and cal.budget_bytes:
        return cal.budget_bytes, f"calibrated budget {fmt_bytes(cal.budget_bytes)}"
    return None


class Ceiling(NamedTuple):
    """The token ceiling a worker starts with, why, and the calibration it came from (its
    JSON, or "" without one: the heartbeat shows it)."""

    value: int
    reason: str
    calibration: str = ""


def resolve_ceiling(
    settings: Any,
    model_name: str,
    device: str,
    max_cost: int | None,
    streams: int = 1,
    default_cost: int | None = None,
) -> Ceiling:
    """The worker's token ceiling and why: explicit setting > calibration + budget > default.

    `streams` batches share the budget when they run at once: each gets 1/streams of the
    activation memory (safe for a convex fit: n * f(c/n) <= f(c)).
    """
    backend = backend_key(settings)
    cal = load_calibration(settings.data_dir, model_name, backend, device)
    value, reason = _ceiling(settings, model_name, device, max_cost, streams, default_cost, cal)
    return Ceiling(value, reason, cal.to_json() if cal is not None else "")


def _ceiling(
    settings: Any,
    model_name: str,
    device: str,
    max_cost: int | None,
    streams: int,
    default_cost: int | None,
    cal: Calibration | None,
) -> tuple[int, str]:
    floor = max_cost or 1
    raised = f"; raised to max_cost={floor} so one longest item fits"
    if "max_batch_tokens" in settings.model_fields_set:
        n = settings.max_batch_tokens
        why = f"INFERQ_MAX_BATCH_TOKENS={n} set explicitly"
        return (n, why) if n >= floor else (floor, why + raised)
    # The model's own default bound (e.g. 32 images in pixels) replaces the text default.
    default = default_cost or type(settings).model_fields["max_batch_tokens"].default
    backend = backend_key(settings)

    def fallback(why: str) -> tuple[int, str]:
        reason = f"default {default}: {why}"
        return (default, reason) if default >= floor else (floor, reason + raised)

    if cal is None:
        return fallback(
            f"no calibration for {model_name}/{backend}/{device} (run `inferq calibrate`)"
        )
    path = calibration_path(settings.data_dir, model_name, backend, device)
    got = device_budget(settings, cal, cal.device_total_bytes)
    if got is None:
        return fallback(f"calibration {path} has no budget; set INFERQ_MEMORY_BUDGET")
    budget, source = got
    workers = settings.workers_per_device
    share = device_share(budget, workers)
    if workers > 1:
        source += f" ÷ {workers} workers on the device = {fmt_bytes(share)}"
    if cal.context_bytes:
        source += f", less the CUDA context {fmt_bytes(cal.context_bytes)}"
    try:
        ceiling = ceiling_for_budget(cal.fit, share - cal.context_bytes, cal.margin)
    except ValueError as e:
        return fallback(f"calibration {path}: {e}")
    why = (
        f"calibration {path}: {source} → {ceiling} tokens "
        f"(margin {cal.margin:g}, fit err {cal.fit.max_rel_err:.0%}, knee {cal.knee_tokens})"
    )
    if streams > 1:
        ceiling //= streams
        why += f", ÷ {streams} batches at once → {ceiling}"
    return (ceiling, why) if ceiling >= floor else (floor, why + raised)
