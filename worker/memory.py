"""Reading device memory: for the watermark log, the calibration and CUDA snapshots.

CUDA numbers come from torch's caching allocator (imported lazily: the echo worker and
ONNX-only setups need no torch). CPU numbers come from /proc: the process's resident set
(RSS) stands for both "allocated" and "reserved", MemTotal for the total.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    # statm is one short line (read once per batch); status is ~60 lines to scan.
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


def nvml_used_bytes(device: str) -> int | None:
    """Device memory this process uses per NVML (ONNX Runtime's arena is invisible to torch).

    Falls back to the whole device's used memory when NVML does not list our pid (as in
    some containers); None without pynvml (`nvidia-ml-py`) or a driver.
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(_cuda_index(device))
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except pynvml.NVMLError:
        return None


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
