"""What a worker's telemetry puts in its metrics: each batch and each final job, in the
series of its model (looked up once), the device memory by kind."""

from __future__ import annotations

import logging

import pytest

from inferq.shared.jobs import Job, JobError, Status
from inferq.shared.metrics import worker_metrics
from inferq.shared.settings import Settings
from inferq.worker.memory import DeviceMemory
from inferq.worker.telemetry import Telemetry


def test_batches_and_finals_land_in_the_models_series() -> None:
    m = worker_metrics()
    t = Telemetry(Settings(model="echo"), "m1", "cpu", m, budget_bytes=7)
    t.on_batch(4, 64, 8192, 0.01, held=4, oldest_wait_s=0.0)
    t.on_batch(2, 20, 8192, 0.01, held=0, oldest_wait_s=0.0)
    job = Job(id="j", model="m1", inputs=["a"], created_ms=1000, started_ms=1500)
    t.on_final(job, Status.SUCCEEDED, None, 3000)
    t.on_final(job, Status.FAILED, JobError("model_error", "x"), 3000)
    t.on_final(Job(id="k", model="m1", inputs=["a"], created_ms=1000), Status.EXPIRED, None, 2000)
    r = m.registry

    def value(name: str, **labels: str) -> float | None:
        return r.get_sample_value(name, labels)

    assert value("inferq_batch_size_count", model="m1") == 2
    assert value("inferq_batch_size_sum", model="m1") == 6
    assert value("inferq_batch_tokens_sum", model="m1") == 84
    assert value("inferq_jobs_finished_total", model="m1", status="succeeded") == 1
    assert value("inferq_jobs_finished_total", model="m1", status="failed") == 1
    assert value("inferq_jobs_finished_total", model="m1", status="expired") == 1
    assert value("inferq_job_queue_seconds_count", model="m1") == 2  # the expired one never started
    assert value("inferq_job_queue_seconds_sum", model="m1") == 1.0
    assert value("inferq_job_latency_seconds_sum", model="m1") == 5.0
    assert value("inferq_device_memory_bytes", kind="budget") == 7
    assert (value("inferq_device_memory_bytes", kind="reserved") or 0) > 0  # the RSS on a CPU
    assert (t.counts.jobs_ok, t.counts.jobs_failed, t.counts.jobs_expired) == (1, 1, 1)


def test_memory_is_read_once_a_second_on_a_cpu_and_the_allocator_each_batch_on_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a CPU the RSS (a /proc read) and on CUDA NVML's footprint are read at most once a
    second, whatever the batch rate; CUDA's allocator counters, which the snapshot trigger
    follows, every batch."""
    from inferq.worker import telemetry

    reads: list[str] = []

    def device_memory(device: str) -> DeviceMemory:
        reads.append(device)
        return DeviceMemory(allocated=len(reads), reserved=len(reads), total=100)

    monkeypatch.setattr(telemetry, "device_memory", device_memory)
    monkeypatch.setattr(telemetry, "footprint_bytes", lambda device: 1000 + len(reads))
    now = [10.0]
    for device, per_batch in (("cpu", False), ("cuda:0", True)):
        reads.clear()
        t = Telemetry(Settings(model="echo"), "m1", device, None, clock=lambda: now[0])
        for _ in range(5):  # five batches within one second
            t.on_batch(1, 8, 8192, 0.001, held=0, oldest_wait_s=0.0)
            now[0] += 0.1
        assert len(reads) == (5 if per_batch else 1), (device, reads)
        first = t.footprint
        now[0] += 1.0
        t.on_batch(1, 8, 8192, 0.001, held=0, oldest_wait_s=0.0)
        assert len(reads) == (6 if per_batch else 2), (device, reads)
        assert t.footprint != first  # read again past the second
        assert t.memory[0] == len(reads)  # the latest reading


def test_one_batch_line_a_second_with_what_ran_since_the_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first batch is logged at once; the rest within its second are not, and the next
    line counts every batch and item since the one before."""
    now = [100.0]
    t = Telemetry(Settings(model="echo"), "m1", "cpu", None, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="inferq.worker"):
        for items in (3, 4, 5, 6):
            t.on_batch(items, 8 * items, 8192, 0.001, held=0, oldest_wait_s=0.0)
            now[0] += 0.3  # 100.0, 100.3, 100.6, 100.9: one line
        now[0] = 101.0
        t.on_batch(7, 56, 8192, 0.001, held=2, oldest_wait_s=0.0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch ")]
    assert len(lines) == 2, lines
    assert lines[0].startswith("batch items=3 tokens=24/8192")
    assert lines[0].endswith("(1 batches, 3 items since the last line)")
    assert lines[1].startswith("batch items=7 tokens=56/8192") and "held=2" in lines[1]
    assert lines[1].endswith("(4 batches, 22 items since the last line)")  # 4+5+6+7
