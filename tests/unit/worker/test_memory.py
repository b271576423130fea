"""The device budget on a fake CUDA device: the context measured beside the allocator's
reserve, the allocator capped at the worker's share, the allocator's configuration left to
a user who set one, and the calibration's meter reading peak *reserved* memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from inferq.shared.settings import Settings
from inferq.worker.calibration.fit import Calibration, Fit, save_calibration
from inferq.worker.calibration.probe import _Meter
from inferq.worker.memory import (
    EXPANDABLE,
    arena_limit_bytes,
    bound_device,
    cap_allocator,
    configure_allocator,
    context_bytes,
)

GiB, MiB = 2**30, 2**20


@dataclass
class FakeCuda:
    """A device whose allocator reserves `reserved_now`, its cache `cached` more until
    `settle` empties it; NVML sees the process as context + reserve (None: no NVML)."""

    context: int = 600 * MiB
    reserved_now: int = 100 * MiB
    cached: int = 0
    peak: int = 0
    neighbours: int = 0  # other processes' memory on the device
    nvml: bool = True
    size: int = 16 * GiB
    caps: list[float] = field(default_factory=list)
    settled: int = 0

    def settle(self) -> None:
        self.settled += 1
        self.cached = 0
        self.peak = self.reserved_now

    def peak_reserved(self) -> int:
        return self.peak

    def reserved(self) -> int:
        return self.reserved_now + self.cached

    def process_used(self) -> int | None:
        return self.context + self.reserved() if self.nvml else None

    def device_used(self) -> int:
        return self.context + self.reserved() + self.neighbours

    def total(self) -> int:
        return self.size

    def cap(self, fraction: float) -> None:
        self.caps.append(fraction)


def test_the_context_is_what_nvml_shows_beyond_the_reserve_with_the_cache_emptied() -> None:
    dev = FakeCuda(cached=2 * GiB)  # a burst left 2 GiB cached
    assert context_bytes(dev) == 600 * MiB and dev.cached == 0 and dev.settled == 1


def test_without_nvml_the_whole_devices_use_stands_in_overstating_never_understating() -> None:
    dev = FakeCuda(nvml=False, neighbours=3 * GiB)
    assert context_bytes(dev) == 600 * MiB + 3 * GiB


def test_the_allocator_is_capped_at_the_share_less_the_context() -> None:
    dev = FakeCuda()
    fraction = cap_allocator(dev, 2 * GiB, 600 * MiB)
    assert dev.caps == [fraction] and fraction == pytest.approx((2 * GiB - 600 * MiB) / (16 * GiB))
    with pytest.raises(ValueError, match="INFERQ_MEMORY_BUDGET"):
        cap_allocator(dev, 512 * MiB, 600 * MiB)
    assert len(dev.caps) == 1  # nothing set for a share that cannot hold the context


def test_bound_device_splits_the_budget_between_the_devices_workers(tmp_path: Path) -> None:
    dev = FakeCuda()
    two = Settings(data_dir=tmp_path, memory_budget="8GiB", workers_per_device=2)
    bound = bound_device(two, "minilm", "cuda:0", dev)
    assert bound is not None and bound.share_bytes == 4 * GiB
    assert bound.context_bytes == 600 * MiB
    assert dev.caps == [pytest.approx((4 * GiB - 600 * MiB) / (16 * GiB))]
    assert "÷ 2 workers" in bound.describe() and "allocator capped" in bound.describe()
    fraction = Settings(data_dir=tmp_path, memory_budget="0.5")  # of the fake's 16 GiB
    got = bound_device(fraction, "minilm", "cuda:0", FakeCuda())
    assert got is not None and got.share_bytes == 8 * GiB


def test_bound_device_takes_the_calibrated_budget_and_none_without_one(tmp_path: Path) -> None:
    plain = Settings(data_dir=tmp_path)
    dev = FakeCuda()
    assert bound_device(plain, "minilm", "cuda:0", dev) is None and dev.caps == []
    save_calibration(
        tmp_path,
        Calibration(
            model="minilm", backend="torch", device="cuda:0", memory_source="t",
            fit=Fit(GiB, 4096, 1, 0, 2), margin=0.9, budget_bytes=3 * GiB, ceiling_tokens=1,
            knee_tokens=1, max_cost=256, device_total_bytes=16 * GiB, load_peak_bytes=None,
            steady_bytes=None,
        ),
    )  # fmt: skip
    got = bound_device(plain, "minilm", "cuda:0", dev)
    assert got is not None and got.share_bytes == 3 * GiB and len(dev.caps) == 1


def test_a_cpu_worker_gets_its_share_and_no_cap(tmp_path: Path) -> None:
    got = bound_device(Settings(data_dir=tmp_path, memory_budget="1GiB"), "m", "cpu")
    assert got is not None and got.share_bytes == GiB and got.fraction == 0.0


def test_onnx_runtimes_arena_limit_is_the_share(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path, memory_budget="6GiB", workers_per_device=3)
    assert arena_limit_bytes(s, "cuda:0") == 2 * GiB
    assert arena_limit_bytes(s, "cpu") is None
    assert arena_limit_bytes(Settings(data_dir=tmp_path), "cuda:0") is None


def test_expandable_segments_unless_the_user_configured_the_allocator() -> None:
    env: dict[str, str] = {}
    assert configure_allocator(env) and env == {"PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE}
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        mine = {var: "max_split_size_mb:128"}
        assert not configure_allocator(mine) and mine == {var: "max_split_size_mb:128"}


def test_the_calibrations_meter_reads_peak_reserved_with_the_cache_emptied_per_probe() -> None:
    dev = FakeCuda(reserved_now=GiB, cached=3 * GiB)
    meter = _Meter("cuda:0", "torch", cuda=dev)
    meter.start()
    assert dev.cached == 0  # a probe starts from an empty cache
    dev.peak = 5 * GiB // 2  # the probe's high-water, cache included
    assert meter.peak() == 5 * GiB // 2
    assert meter.context() == 600 * MiB
    assert "max_memory_reserved" in meter.source


def test_nvml_readings_with_a_fake_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """The footprint is NVML's figure for this process; the device's use where NVML does
    not list it; nothing (never an exception) where NVML answers with an error."""
    import os
    import sys
    import types

    from inferq.worker import memory

    listed = [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=700 * MiB)]
    info = types.SimpleNamespace(used=3 * GiB, total=16 * GiB)
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetComputeRunningProcesses=lambda h: listed,
        nvmlDeviceGetMemoryInfo=lambda h: info,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert memory.nvml_process_bytes("cuda:0") == 700 * MiB
    assert memory.footprint_bytes("cuda:0") == 700 * MiB
    assert memory.nvml_total_bytes("cuda:1") == 16 * GiB
    listed.clear()  # a container where NVML does not see our pid
    assert memory.nvml_process_bytes("cuda:0") is None
    assert memory.nvml_used_bytes("cuda:0") == 3 * GiB

    def refuse(handle: int) -> None:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    fake.nvmlDeviceGetMemoryInfo = refuse
    assert memory.nvml_used_bytes("cuda:0") is None
    assert memory.nvml_total_bytes("cuda:0") is None
