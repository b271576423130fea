"""`inferq calibrate`: measure memory per padded token on a device, turn a budget into a ceiling.

The load test a person would run by hand, done by the machine: probe batches of growing
padded size (items × longest item) on the target device, record each one's peak memory
and latency, fit `memory ≈ base + per_token × padded_tokens` by least squares, and write
the result to `<data_dir>/calibration/<model>-<backend>-<device>.json`.

The arithmetic and the file are `inferq.worker.calibration.fit`; the worker reads the file at
start (`fit.resolve_ceiling`).

How peak memory is measured, per device:
- CUDA + torch: the cache emptied and the peak reset before each probe, then
  `max_memory_reserved`: what the allocator held, which is what the device gives up (peak
  *allocated* left out the cache: a 2 GiB budget peaked at 3.6–3.9 GiB on an H200). The
  CUDA context, which the allocator never sees, is measured once after load
  (`inferq.worker.memory.context_bytes`: NVML's figure for the process less the reserve) and
  stored beside the fit, so the ceiling leaves room for it.
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

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferq.shared.settings import Settings
from inferq.worker.calibration.fit import (
    DEFAULT_BUDGET,
    DEFAULT_MARGIN,
    Calibration,
    Probe,
    backend_key,
    ceiling_for_budget,
    fit_memory,
    fmt_bytes,
    latency_knee,
    parse_budget,
    save_calibration,
)
from inferq.worker.memory import (
    CudaMemory,
    TorchCuda,
    context_bytes,
    device_memory,
    nvml_used_bytes,
    peak_rss_bytes,
    reset_peak_rss,
    rss_bytes,
)
from inferq.worker.models.base import probe_inputs

log = logging.getLogger("inferq.worker")


# --- probing ---
def _payload_for_cost(model: Any, target: int) -> tuple[Any, int]:
    """A prepared payload whose cost is as close to `target` as the model allows."""

    def cost(n: int) -> tuple[Any, int]:
        probe = probe_inputs(model, n)
        if probe is None:
            raise ValueError(f"{type(model).__name__} has no probe_inputs(cost): cannot probe it")
        p = model.prepare(*probe)[0]
        return p.payload, p.cost

    lo, hi = 1, max(2, 2 * target)
    while lo < hi:  # smallest request whose cost reaches target (cost grows with the request)
        mid = (lo + hi) // 2
        if cost(mid)[1] >= target:
            hi = mid
        else:
            lo = mid + 1
    return cost(lo)


class _Meter:
    """Peak memory around one call, the way this device/backend allows (see module doc)."""

    def __init__(self, device: str, backend: str, cuda: CudaMemory | None = None) -> None:
        self.device = device
        self.cuda = device.startswith("cuda")
        self.nvml = self.cuda and backend.startswith("onnx")
        self.resettable = self.cuda or reset_peak_rss()
        self.mem: CudaMemory | None = None
        if self.cuda and not self.nvml:
            self.mem = cuda or TorchCuda(device)
        if self.nvml:
            self.source = "nvml used (ORT arena high-water, ascending probes)"
        elif self.cuda:
            self.source = "torch.cuda.max_memory_reserved, cache emptied per probe, + context"
        elif self.resettable:
            self.source = "VmHWM reset per probe via /proc/self/clear_refs (ascending probes)"
        else:
            self.source = "VmHWM, not resettable here: monotonic over ascending probes"

    def start(self) -> None:
        if self.mem is not None:
            self.mem.settle()
        elif not self.cuda and self.resettable:
            reset_peak_rss()

    def peak(self) -> int | None:
        if self.nvml:
            return nvml_used_bytes(self.device)
        if self.mem is not None:
            return self.mem.peak_reserved()
        return peak_rss_bytes()

    def now(self) -> int:
        if self.nvml:
            return nvml_used_bytes(self.device) or 0
        if self.mem is not None:
            return self.mem.reserved()
        return device_memory(self.device).allocated if self.cuda else rss_bytes()

    def context(self) -> int:
        """The footprint beyond the allocator's reserve: the CUDA context (torch on CUDA);
        0 where the peak already counts everything (RSS on a CPU, NVML for ONNX Runtime)."""
        return context_bytes(self.mem) if self.mem is not None else 0


def run_probes(
    model: Any,
    meter: _Meter,
    grid: tuple[Sequence[int], Sequence[int]],
    *,
    repeats: int,
    max_tokens: int,
    time_limit_s: float,
    progress: Callable[[Sequence[Any]], Any] = lambda xs: xs,
) -> list[Probe]:
    """Run every (length, batch) of `grid` (lengths, batch sizes) with padded ≤ max_tokens,
    ascending; stop at OOM or time."""
    lengths, batch_sizes = grid
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
                time_limit_s,
                padded,
            )
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


@dataclass(frozen=True, slots=True)
class CalibrateOptions:
    """What to probe; the model, backend and device come from the settings passed in."""

    budget: str = DEFAULT_BUDGET  # bytes ('6GiB') or a fraction of the device ('0.8')
    margin: float = DEFAULT_MARGIN
    lengths: Sequence[int] | None = None  # item costs to probe (default: the device's grid)
    batch_sizes: Sequence[int] | None = None
    max_tokens: int | None = None  # largest padded probe
    repeats: int = 3  # timed runs per probe (median)
    time_limit_s: float = 80.0  # probing stops within this
    progress: bool = True


def _progress(disabled: bool) -> Callable[[Sequence[Any]], Any]:
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a nicety: probe without a bar
        return lambda xs: xs
    return lambda xs: tqdm(xs, desc="probing", unit="probe", disable=disabled)


def calibrate(settings: Settings, args: CalibrateOptions) -> tuple[Calibration, Path]:
    """Load `settings.model` on `settings.device`, probe, fit, write the file; returns the
    calibration and its path. Raises ValueError for a malformed budget before loading."""
    from inferq.worker.models.registry import build_model
    from inferq.worker.plan import resolve_backend, resolve_device, resolve_dtype

    parse_budget(args.budget, 1)  # fail on a malformed budget before loading anything
    device = resolve_device(settings.device)
    spec = settings.default_model
    backend_name = resolve_backend(settings.backend, device, spec.target)
    dtype = resolve_dtype(settings.dtype, device, spec.target)
    settings = settings.model_copy(
        update={"device": device, "backend": backend_name, "dtype": dtype}
    )
    backend = backend_key(settings)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    meter = _Meter(device, backend)

    meter.start()
    model = build_model(spec, settings)
    model.load(device)
    load_peak = meter.peak()
    model.run([_payload_for_cost(model, 8)[0]])
    steady = meter.now()
    context = meter.context()

    max_cost = getattr(model, "max_cost", None)
    lengths, sizes = _GRID[kind]
    lengths = sorted({min(n, max_cost or n) for n in (args.lengths or lengths)})
    probes = run_probes(
        model,
        meter,
        (lengths, args.batch_sizes or sizes),
        repeats=max(1, args.repeats),
        max_tokens=args.max_tokens or _MAX_TOKENS[kind],
        time_limit_s=args.time_limit_s,
        progress=_progress(not args.progress),
    )
    ok = [p for p in probes if not p.oom and p.peak_bytes is not None]
    fit = fit_memory([(p.padded_tokens, p.peak_bytes or 0) for p in ok])
    total = device_memory(device).total
    budget = parse_budget(args.budget, total)
    try:
        ceiling: int | None = ceiling_for_budget(
            fit, budget - context, args.margin, min_tokens=max_cost or 1
        )
    except ValueError as e:
        log.warning("no ceiling: %s", e)
        ceiling = None
    cal = Calibration(
        model=spec.name,
        backend=backend,
        device=device,
        memory_source=meter.source,
        fit=fit,
        margin=args.margin,
        budget_bytes=budget,
        ceiling_tokens=ceiling,
        knee_tokens=latency_knee([(p.padded_tokens, p.latency_s) for p in ok]),
        max_cost=max_cost,
        device_total_bytes=total,
        load_peak_bytes=load_peak,
        steady_bytes=steady,
        probes=probes,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        context_bytes=context,
    )
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
        f"context {fmt_bytes(cal.context_bytes)}, device total {fmt_bytes(cal.device_total_bytes)}",
        f"budget {fmt_bytes(cal.budget_bytes or 0)} → ceiling {ceiling} padded tokens "
        f"({cal.margin:g} × (budget − context − base) / per_token); latency knee "
        f"{cal.knee_tokens} tokens",
    ]
    return "\n".join(lines)
