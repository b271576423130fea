"""`inferq calibrate` on the real minilm weights, on this CPU (seconds, not minutes)."""

from __future__ import annotations

import time
from pathlib import Path

from inferq.shared.settings import Settings
from inferq.worker.calibration.fit import calibration_path, load_calibration
from inferq.worker.calibration.probe import CalibrateOptions, calibrate, format_table

MiB = 2**20


def test_quick_cpu_calibration_of_minilm(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, device="cpu", model="minilm", backend="torch")
    args = CalibrateOptions(
        budget="2GiB", lengths=(8, 32), batch_sizes=(1, 4, 16), repeats=1, progress=False
    )
    t0 = time.monotonic()
    c, path = calibrate(settings, args)
    assert time.monotonic() - t0 < 30
    assert path == calibration_path(tmp_path, "minilm", "torch", "cpu") and path.is_file()
    assert load_calibration(tmp_path, "minilm", "torch", "cpu") == c
    assert len(c.probes) == 6 and all(p.peak_bytes and p.latency_s > 0 for p in c.probes)
    assert [p.padded_tokens for p in c.probes] == sorted(p.padded_tokens for p in c.probes)
    assert c.fit.base_bytes > 50 * MiB  # the weights and the runtime are resident
    assert c.load_peak_bytes and c.steady_bytes and c.max_cost == 256
    table = format_table(c)
    assert "fit: memory ≈" in table and "ceiling" in table
