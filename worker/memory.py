"""Reading and bounding device memory: the watermark log, the calibration, the allocator's
cap, CUDA snapshots.

CUDA numbers come from torch's caching allocator (imported lazily: the echo worker and
ONNX-only setups need no torch) and, for the process's whole footprint (what nvidia-smi
shows: context, weights, the allocator's reserve), from NVML. CPU numbers come from /proc:
the process's resident set (RSS) stands for "allocated", "reserved" and the footprint alike,
MemTotal for the total. What the calibration and the worker read of a CUDA device goes
through `CudaMemory`, so the budget's logic is tested with a fake device.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from inferq.worker.calibration.fit import (
    allocator_fraction,
    backend_key,
    device_budget,
    device_share,
    fmt_bytes,
    load_calibration,
    parse_budget,
)

log = logging.getLogger("inferq.worker")


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """Bytes: what tensors hold, what the allocator holds (≥ allocated), the device's size."""

    allocated: int
    reserved: int
    total: int

    @property
    def fraction_used(self) -> float:
        return self.reserved / self.total if self.total else 0.0


def _proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Current resident set size of this process."""
    # statm is one short line; status is ~60 lines to scan.
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        pass
    # No /proc (macOS): the peak is the best we have; ru_maxrss is bytes there.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def peak_rss_bytes() -> int:
    """The process's RSS high-water mark (VmHWM), since start or the last `reset_peak_rss`."""
    kb = _proc_status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0: write 5 to clear_refs); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@functools.cache
def host_total_bytes() -> int:
    kb = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    kb = int(line.split()[1])
                    break
    except OSError:
        pass
    if kb is not None:
        return kb * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cuda_index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


def device_memory(device: str) -> DeviceMemory:
    """Memory now on `device` ("cpu", "cuda", "cuda:N")."""
    if device.startswith("cuda"):
        import torch

        i = _cuda_index(device)
        return DeviceMemory(
            allocated=torch.cuda.memory_allocated(i),
            reserved=torch.cuda.memory_reserved(i),
            total=_cuda_total_bytes(i),
        )
    rss = rss_bytes()
    return DeviceMemory(allocated=rss, reserved=rss, total=host_total_bytes())


@functools.cache
def _cuda_total_bytes(index: int) -> int:
    import torch

    return int(torch.cuda.get_device_properties(index).total_memory)


def device_total_bytes(device: str) -> int:
    return device_memory(device).total


def _nvml(device: str, read: Callable[[Any, Any], int | None]) -> int | None:
    """`read(pynvml, handle)` for `device`'s NVML handle; None without pynvml
    (`nvidia-ml-py`) or a driver, or when NVML answers with an error."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return read(pynvml, pynvml.nvmlDeviceGetHandleByIndex(_cuda_index(device)))
    except (ImportError, AttributeError, OSError):
        return None
    except Exception as e:  # pynvml.NVMLError, without importing pynvml to name it
        log.debug("nvml: %s", e)
        return None


def _own_bytes(pynvml: Any, handle: Any) -> int | None:
    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
            return int(proc.usedGpuMemory)
    return None


def nvml_process_bytes(device: str) -> int | None:
    """This process's device memory per NVML, the figure nvidia-smi shows for it; None
    without NVML, or when NVML does not list our pid (some containers)."""
    return _nvml(device, _own_bytes)


def nvml_used_bytes(device: str) -> int | None:
    """Device memory this process uses per NVML (ONNX Runtime's arena is invisible to torch);
    the whole device's used memory when NVML does not list our pid; None without NVML."""
    own = nvml_process_bytes(device)
    if own is not None:
        return own
    return _nvml(device, lambda pynvml, h: int(pynvml.nvmlDeviceGetMemoryInfo(h).used))


def nvml_total_bytes(device: str) -> int | None:
    return _nvml(device, lambda pynvml, h: int(pynvml.nvmlDeviceGetMemoryInfo(h).total))


def footprint_bytes(device: str) -> int:
    """The process's footprint on `device`, as the budget counts it: NVML's figure for this
    process on CUDA (the allocator's reserve where NVML is missing), the RSS on a CPU."""
    if not device.startswith("cuda"):
        return rss_bytes()
    used = nvml_used_bytes(device)
    return used if used is not None else device_memory(device).reserved


class CudaMemory(Protocol):
    """What the calibration and the worker read and set on one CUDA device."""

    def settle(self) -> None:
        """Wait for the device, hand cached blocks back to it, and restart the peak."""

    def peak_reserved(self) -> int: ...

    def reserved(self) -> int: ...

    def process_used(self) -> int | None:
        """This process's device memory per NVML (None without NVML)."""

    def device_used(self) -> int:
        """The whole device's used memory, every process's (total − free)."""

    def total(self) -> int: ...

    def cap(self, fraction: float) -> None:
        """Cap what the allocator may reserve at `fraction` of the device."""


class TorchCuda:
    """`CudaMemory` over torch's caching allocator and NVML."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.index = _cuda_index(device)

    def settle(self) -> None:
        import torch

        torch.cuda.synchronize(self.index)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.index)

    def peak_reserved(self) -> int:
        import torch

        torch.cuda.synchronize(self.index)
        return int(torch.cuda.max_memory_reserved(self.index))

    def reserved(self) -> int:
        import torch

        return int(torch.cuda.memory_reserved(self.index))

    def process_used(self) -> int | None:
        return nvml_process_bytes(self.device)

    def device_used(self) -> int:
        import torch

        free, total = torch.cuda.mem_get_info(self.index)
        return int(total - free)

    def total(self) -> int:
        return _cuda_total_bytes(self.index)

    def cap(self, fraction: float) -> None:
        import torch

        torch.cuda.set_per_process_memory_fraction(fraction, self.index)


def context_bytes(mem: CudaMemory) -> int:
    """What the process holds on the device beyond the allocator's reserve (the CUDA context,
    library workspaces), with the cache emptied first. Without NVML, the whole device's use
    stands in for the process's: on a shared device that overstates the context, which only
    makes the ceiling smaller, never larger."""
    mem.settle()
    used = mem.process_used()
    if used is None:
        used = mem.device_used()
    return max(0, used - mem.reserved())


ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
EXPANDABLE = "expandable_segments:True"


def configure_allocator(env: MutableMapping[str, str]) -> bool:
    """Expandable segments for torch's CUDA allocator unless the user configured it: memory
    freed by a large batch goes back in pages instead of staying reserved in whole segments
    (measured on an H200 at a 2 GiB budget: 3.6–3.9 GiB peak without, 2.6 with). Read when
    torch first touches CUDA, so call it before the model loads. True if it set it."""
    if any(v in env for v in ALLOC_CONF_VARS):
        return False
    env["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE
    return True


def cap_allocator(mem: CudaMemory, share_bytes: int, context: int) -> float:
    """Cap the allocator at the worker's share less the context: past it, an allocation
    raises torch's OutOfMemoryError, which the executor turns into a lower ceiling and a
    split, inside the share. Returns the fraction of the device set."""
    fraction = allocator_fraction(share_bytes, context, mem.total())
    mem.cap(fraction)
    return fraction


@dataclass(frozen=True, slots=True)
class DeviceBound:
    """A worker's part of its device's budget: `share_bytes` (the budget ÷ the workers on the
    device), the context measured beside it, and the allocator's cap (0.0: none set)."""

    share_bytes: int
    context_bytes: int
    fraction: float
    source: str

    def describe(self) -> str:
        cap = f", allocator capped at {self.fraction:.2%} of the device" if self.fraction else ""
        return (
            f"device budget {self.source}; this worker's share {fmt_bytes(self.share_bytes)}, "
            f"context {fmt_bytes(self.context_bytes)}{cap}"
        )


def bound_device(
    settings: Any, model_name: str, device: str, mem: CudaMemory | None = None
) -> DeviceBound | None:
    """This worker's share of the device budget (INFERQ_MEMORY_BUDGET, else the calibrated
    one; None with neither), and with torch on CUDA its allocator capped there. Call it
    after the model loaded and warmed up, so the context it measures is the real one."""
    cal = load_calibration(settings.data_dir, model_name, backend_key(settings), device)
    cuda_torch = device.startswith("cuda") and settings.backend != "onnx"
    if cuda_torch:
        mem = mem or TorchCuda(device)
    total = mem.total() if mem is not None else device_total_bytes(device)
    got = device_budget(settings, cal, total)
    if got is None:
        return None
    budget, source = got
    share = device_share(budget, settings.workers_per_device)
    if settings.workers_per_device > 1:
        source += f" ÷ {settings.workers_per_device} workers"
    if mem is None:
        return DeviceBound(share, 0, 0.0, source)
    context = context_bytes(mem)
    return DeviceBound(share, context, cap_allocator(mem, share, context), source)


def arena_limit_bytes(settings: Any, device: str) -> int | None:
    """ONNX Runtime's CUDA arena limit (`gpu_mem_limit`): this worker's share of the budget
    (the CUDA context sits outside the arena, so the footprint runs that much above it);
    None off CUDA or without a budget."""
    if not device.startswith("cuda") or not settings.memory_budget:
        return None
    try:
        budget = parse_budget(settings.memory_budget, None)
    except ValueError:  # a fraction: of the device's total, which NVML knows without torch
        total = nvml_total_bytes(device)
        if total is None:
            return None
        budget = parse_budget(settings.memory_budget, total)
    return device_share(budget, settings.workers_per_device)


@dataclass(slots=True)
class SnapshotState:
    """Per-worker memory of when the last snapshot was taken (monotonic seconds)."""

    last_at: float | None = None


def enable_history(device: str, max_entries: int = 100_000) -> None:
    """Record allocation stack traces so snapshots say *who* allocated (CUDA only; costs a
    little per allocation, so call it only when `snapshot_at` is set)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.memory._record_memory_history(max_entries=max_entries)


def maybe_snapshot(
    device: str, fraction_used: float, settings: Any, state: SnapshotState
) -> Path | None:
    """Dump `torch.cuda.memory._snapshot()` when usage passes `settings.snapshot_at`.

    At most once per `settings.snapshot_cooldown_s`; never on CPU. torch writes the file in
    its own format (the one https://pytorch.org/memory_viz reads); inferq never reads it.
    """
    threshold = settings.snapshot_at
    if not device.startswith("cuda") or threshold is None or fraction_used < threshold:
        return None
    now = time.monotonic()
    if state.last_at is not None and now - state.last_at < settings.snapshot_cooldown_s:
        return None
    state.last_at = now
    import torch

    directory = Path(settings.data_dir) / "snapshots"
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = directory / f"{stamp}-{device.replace(':', '_')}-{int(fraction_used * 100)}pct.pickle"
    torch.cuda.memory._dump_snapshot(str(path))
    log.warning(
        "device %s at %.0f%% (>= snapshot_at %.0f%%): memory snapshot written to %s",
        device,
        fraction_used * 100,
        threshold * 100,
        path,
    )
    return path
