"""`inferq calibrate`: measure memory per padded token on a device, turn a budget into a ceiling.

The load test a person would run by hand, done by the machine: probe batches of growing
padded size (items × longest item) on the target device, record each one's peak memory
and latency, fit `memory ≈ base + per_token × padded_tokens` by least squares, and write
the result to `<data_dir>/calibration/<model>-<backend>-<device>.json`.

The worker calls the pure half of this module (`resolve_ceiling`) at start:

    token ceiling = margin × (budget − base) / per_token        (margin 0.9 by default)

never below the model's `max_cost` (one longest item must always fit), and overridden by
an explicitly set `INFERQ_MAX_BATCH_TOKENS`.

How peak memory is measured, per device:
- CUDA + torch: `reset_peak_memory_stats` then `max_memory_allocated` around each probe.
- CUDA + ONNX Runtime: NVML (`nvidia-ml-py`) after each probe. ORT's arena only grows, so
  in ascending order the reading is the arena's high-water mark at that size.
- CPU: the process's RSS high-water mark (VmHWM), reset before each probe by writing 5 to
  /proc/self/clear_refs. A reset sets the mark to the *current* RSS, and freed memory that
  the allocator keeps (glibc heap, ORT's arena) stays resident, so probes run in ascending
  padded size: each peak then includes what smaller batches left behind, which is what a
  long-running worker carries too. Without clear_refs (some sandboxes) the mark is
  monotonic over the run; ascending order keeps that honest as well, only flatter.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferq.worker.memory import (
    device_memory,
    nvml_used_bytes,
    peak_rss_bytes,
    reset_peak_rss,
    rss_bytes,
)

log = logging.getLogger("inferq.worker")

DEFAULT_MARGIN = 0.9
#: The knee: the padded size past which tokens/s grows by less than this fraction.
KNEE_GAIN = 0.05
DEFAULT_BUDGET = "0.8"  # when neither --budget nor INFERQ_MEMORY_BUDGET is given
FILE_VERSION = 1

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*|%)\s*$")


# --- pure functions ---
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


# --- the file ---
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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        raw = json.loads(text)
        if raw.get("version") != FILE_VERSION:
            raise ValueError(f"calibration file version {raw.get('version')!r} != {FILE_VERSION}")
        raw["fit"] = Fit(**raw["fit"])
        raw["probes"] = [Probe(**p) for p in raw["probes"]]
        return cls(**raw)


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", part)


def backend_key(settings: Any) -> str:
    """What the calibration is keyed by besides model and device: the runtime and precision."""
    if settings.backend == "onnx":
        return "onnx" if settings.onnx_variant == "fp32" else f"onnx-{settings.onnx_variant}"
    return "torch" if settings.dtype == "float32" else f"torch-{settings.dtype}"


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


def resolve_ceiling(
    settings: Any, model_name: str, device: str, max_cost: int | None, streams: int = 1
) -> tuple[int, str]:
    """The worker's token ceiling and why: explicit setting > calibration + budget > default.

    `streams` batches share the budget when they run at once: each gets 1/streams of the
    activation memory (safe for a convex fit: n * f(c/n) <= f(c)).
    """
    floor = max_cost or 1
    raised = f"; raised to max_cost={floor} so one longest item fits"
    if "max_batch_tokens" in settings.model_fields_set:
        n = settings.max_batch_tokens
        why = f"INFERQ_MAX_BATCH_TOKENS={n} set explicitly"
        return (n, why) if n >= floor else (floor, why + raised)
    default = type(settings).model_fields["max_batch_tokens"].default
    backend = backend_key(settings)
    cal = load_calibration(settings.data_dir, model_name, backend, device)

    def fallback(why: str) -> tuple[int, str]:
        reason = f"default {default}: {why}"
        return (default, reason) if default >= floor else (floor, reason + raised)

    if cal is None:
        return fallback(
            f"no calibration for {model_name}/{backend}/{device} (run `inferq calibrate`)"
        )
    path = calibration_path(settings.data_dir, model_name, backend, device)
    if settings.memory_budget:
        budget = parse_budget(settings.memory_budget, cal.device_total_bytes)
        source = f"INFERQ_MEMORY_BUDGET={settings.memory_budget} = {fmt_bytes(budget)}"
    elif cal.budget_bytes:
        budget, source = cal.budget_bytes, f"calibrated budget {fmt_bytes(cal.budget_bytes)}"
    else:
        return fallback(f"calibration {path} has no budget; set INFERQ_MEMORY_BUDGET")
    try:
        ceiling = ceiling_for_budget(cal.fit, budget, cal.margin)
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


# --- probing ---
_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "tired",
    "cats",
    "watch",
]


def _payload_for_cost(model: Any, target: int) -> tuple[Any, int]:
    """A prepared payload whose cost is as close to `target` as the model allows."""

    def cost(n: int) -> tuple[Any, int]:
        p = model.prepare([" ".join(_WORDS[i % len(_WORDS)] for i in range(n))])[0]
        return p.payload, p.cost

    lo, hi = 1, max(2, 2 * target)
    while lo < hi:  # smallest word count whose cost reaches target (cost grows with words)
        mid = (lo + hi) // 2
        if cost(mid)[1] >= target:
            hi = mid
        else:
            lo = mid + 1
    return cost(lo)


class _Meter:
    """Peak memory around one call, the way this device/backend allows (see module doc)."""

    def __init__(self, device: str, backend: str) -> None:
        self.device = device
        self.cuda = device.startswith("cuda")
        self.nvml = self.cuda and backend.startswith("onnx")
        self.resettable = self.cuda or reset_peak_rss()
        if self.nvml:
            self.source = "nvml used (ORT arena high-water, ascending probes)"
        elif self.cuda:
            self.source = "torch.cuda.max_memory_allocated after reset_peak_memory_stats"
        elif self.resettable:
            self.source = "VmHWM reset per probe via /proc/self/clear_refs (ascending probes)"
        else:
            self.source = "VmHWM, not resettable here: monotonic over ascending probes"

    def start(self) -> None:
        if self.cuda and not self.nvml:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif not self.cuda and self.resettable:
            reset_peak_rss()

    def peak(self) -> int | None:
        if self.nvml:
            return nvml_used_bytes(self.device)
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        return peak_rss_bytes()

    def now(self) -> int:
        if self.nvml:
            return nvml_used_bytes(self.device) or 0
        return device_memory(self.device).allocated if self.cuda else rss_bytes()


def run_probes(
    model: Any,
    meter: _Meter,
    lengths: Sequence[int],
    batch_sizes: Sequence[int],
    *,
    repeats: int,
    max_tokens: int,
    time_limit_s: float,
    progress: Callable[[Sequence[Any]], Any] = lambda xs: xs,
) -> list[Probe]:
    """Run every (length, batch) with padded ≤ max_tokens, ascending; stop at OOM or time."""
    from inferq.worker.models.base import DeviceOutOfMemory

    payloads = {n: _payload_for_cost(model, n) for n in lengths}
    plan = sorted(
        ((b * payloads[n][1], b, n) for n in lengths for b in batch_sizes),
        key=lambda t: (t[0], t[2]),
    )
    plan = [p for p in plan if p[0] <= max_tokens]
    started, probes, oom_at, per_token_s = time.monotonic(), [], None, 0.0
    bar = progress(plan)
    for padded, b, n in bar:
        if oom_at is not None and padded >= oom_at:
            continue
        # Predict this probe's time from the last one (latency ∝ padded tokens, roughly):
        # a probe that would overrun the limit is skipped rather than started.
        expected_s = (repeats + 1) * per_token_s * padded
        if time.monotonic() - started + expected_s > time_limit_s:
            log.warning(
                "calibration time limit %.0fs: skipping probes from %d padded tokens",
                time_limit_s, padded,
            )  # fmt: skip
            break
        payload, length = payloads[n]
        batch = [payload] * b
        model.run(batch)  # warm this shape: the first call pays for kernel/graph setup
        meter.start()
        latencies = []
        try:
            for _ in range(repeats):
                t0 = time.perf_counter()
                model.run(batch)
                latencies.append(time.perf_counter() - t0)
        except DeviceOutOfMemory:
            oom_at = padded
            probes.append(Probe(b, length, padded, meter.peak(), 0.0, oom=True))
            continue
        probes.append(Probe(b, length, padded, meter.peak(), statistics.median(latencies)))
        per_token_s = max(latencies) / padded
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(f"{padded} tok, {fmt_bytes(probes[-1].peak_bytes or 0)}")
    return probes


# --- the command ---
_GRID = {  # (lengths, batch sizes): small enough for two minutes on a laptop CPU
    "cpu": ([16, 64, 128, 256], [1, 2, 4, 8, 16, 32]),
    "cuda": ([32, 64, 128, 256, 512], [1, 8, 32, 64, 128, 256]),
}
_MAX_TOKENS = {"cpu": 8192, "cuda": 131_072}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _parser(settings: Any) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inferq calibrate", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=settings.model, help="model spec (default INFERQ_MODEL)")
    p.add_argument("--backend", choices=["torch", "onnx"], default=settings.backend)
    p.add_argument("--variant", choices=["fp32", "int8"], default=settings.onnx_variant)
    p.add_argument("--device", default=settings.device, help="cpu, cuda, cuda:N, auto")
    p.add_argument(
        "--budget",
        default=settings.memory_budget or DEFAULT_BUDGET,
        help="'6GiB', '512MiB' or a fraction of the device (default INFERQ_MEMORY_BUDGET, else 0.8)",
    )
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help="safety factor in (0, 1]")
    p.add_argument("--lengths", type=_ints, default=None, help="item lengths, e.g. 16,64,256")
    p.add_argument("--batch-sizes", type=_ints, default=None, help="e.g. 1,4,16,32")
    p.add_argument("--max-tokens", type=int, default=None, help="largest padded probe")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per probe (median)")
    p.add_argument("--time-limit-s", type=float, default=80.0, help="probing stops within this")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _progress(disabled: bool) -> Callable[[Sequence[Any]], Any]:
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a nicety: probe without a bar
        return lambda xs: xs
    return lambda xs: tqdm(xs, desc="probing", unit="probe", disable=disabled)


def calibrate(settings: Any, args: argparse.Namespace) -> tuple[Calibration, Path]:
    """Load the model on the device, probe, fit, write the file; returns it and its path."""
    from inferq.shared.settings import ModelSpec
    from inferq.worker.main import resolve_device
    from inferq.worker.models.registry import build_model

    device = resolve_device(args.device)
    settings = settings.model_copy(
        update={"backend": args.backend, "onnx_variant": args.variant, "device": device}
    )
    spec = ModelSpec(args.model)
    spec = settings.served_models.get(spec.name, spec) if "=" not in args.model else spec
    backend = backend_key(settings)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    meter = _Meter(device, backend)

    meter.start()
    model = build_model(spec, settings)
    model.load(device)
    load_peak = meter.peak()
    model.run([p.payload for p in model.prepare(["inferq warm-up"])])
    steady = meter.now()

    max_cost = getattr(model, "max_cost", None)
    lengths, sizes = _GRID[kind]
    lengths = sorted({min(n, max_cost or n) for n in (args.lengths or lengths)})
    probes = run_probes(
        model, meter, lengths, args.batch_sizes or sizes,
        repeats=max(1, args.repeats), max_tokens=args.max_tokens or _MAX_TOKENS[kind],
        time_limit_s=args.time_limit_s, progress=_progress(args.no_progress),
    )  # fmt: skip
    ok = [p for p in probes if not p.oom and p.peak_bytes is not None]
    fit = fit_memory([(p.padded_tokens, p.peak_bytes or 0) for p in ok])
    total = device_memory(device).total
    budget = parse_budget(args.budget, total)
    try:
        ceiling: int | None = ceiling_for_budget(fit, budget, args.margin, min_tokens=max_cost or 1)
    except ValueError as e:
        log.warning("no ceiling: %s", e)
        ceiling = None
    cal = Calibration(
        model=spec.name, backend=backend, device=device, memory_source=meter.source, fit=fit,
        margin=args.margin, budget_bytes=budget, ceiling_tokens=ceiling,
        knee_tokens=latency_knee([(p.padded_tokens, p.latency_s) for p in ok]),
        max_cost=max_cost, device_total_bytes=total, load_peak_bytes=load_peak,
        steady_bytes=steady, probes=probes, created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )  # fmt: skip
    return cal, save_calibration(settings.data_dir, cal)


def format_table(cal: Calibration) -> str:
    """The probes, the fit and the verdict, as printed at the end of `inferq calibrate`."""
    head = f"{'batch':>5} {'len':>4} {'padded':>6} {'peak':>10} {'fit':>10} {'err':>6} {'ms':>8} {'items/s':>8} {'tok/s':>8}"
    lines = [f"calibration {cal.model}/{cal.backend}/{cal.device} ({cal.memory_source})", head]
    for p in cal.probes:
        if p.oom:
            lines.append(f"{p.batch_size:>5} {p.length:>4} {p.padded_tokens:>6}  OOM")
            continue
        peak, pred = p.peak_bytes or 0, cal.fit.predict(p.padded_tokens)
        err = (pred - peak) / peak if peak else 0.0
        lines.append(
            f"{p.batch_size:>5} {p.length:>4} {p.padded_tokens:>6} {fmt_bytes(peak):>10} "
            f"{fmt_bytes(pred):>10} {err:>+6.1%} {p.latency_s * 1000:>8.1f} "
            f"{p.items_per_s:>8.1f} {p.padded_tokens / p.latency_s:>8.0f}"
        )
    f = cal.fit
    ceiling = "none (memory did not grow)" if cal.ceiling_tokens is None else cal.ceiling_tokens
    lines += [
        f"fit: memory ≈ {fmt_bytes(f.base_bytes)} + {f.per_token_bytes / 1024:.1f} KiB × padded "
        f"tokens (R² {f.r2:.4f}, max rel err {f.max_rel_err:.1%}, n={f.n})",
        f"load peak {fmt_bytes(cal.load_peak_bytes or 0)}, steady {fmt_bytes(cal.steady_bytes or 0)}, "
        f"device total {fmt_bytes(cal.device_total_bytes)}",
        f"budget {fmt_bytes(cal.budget_bytes or 0)} → ceiling {ceiling} padded tokens "
        f"({cal.margin:g} × (budget − base) / per_token); latency knee {cal.knee_tokens} tokens",
    ]
    return "\n".join(lines)


def main(settings: Any, argv: list[str]) -> int:
    from inferq.shared.logs import setup_logging

    setup_logging(settings.log_level, settings.log_format)
    if argv[:1] == ["--"]:  # `inferq calibrate -- --model ...`: argparse.REMAINDER keeps it
        argv = argv[1:]
    args = _parser(settings).parse_args(argv)
    try:
        parse_budget(args.budget, 1)  # fail on a malformed budget before loading anything
    except ValueError as e:
        print(f"inferq calibrate: {e}")
        return 2
    t0 = time.monotonic()
    cal, path = calibrate(settings, args)
    print(format_table(cal))
    print(f"written to {path} in {time.monotonic() - t0:.0f}s")
    return 0
