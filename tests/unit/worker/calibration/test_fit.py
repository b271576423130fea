"""Calibration: budget parsing, the fit, the ceiling, the knee, the file, the worker's choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferq.shared.settings import Settings
from inferq.worker.calibration import fit as cal
from inferq.worker.calibration.fit import (
    Calibration,
    Fit,
    Probe,
    calibration_path,
    ceiling_for_budget,
    fit_memory,
    latency_knee,
    load_calibration,
    parse_budget,
    resolve_ceiling,
    save_calibration,
)

GiB, MiB = 2**30, 2**20


@pytest.mark.parametrize(
    ("text", "total", "expected"),
    [
        ("6GiB", None, 6 * GiB),
        ("512MiB", None, 512 * MiB),
        ("512 mib", None, 512 * MiB),
        ("1.5GB", None, 1_500_000_000),
        ("2000000000", None, 2_000_000_000),
        ("100B", None, 100),
        ("0.8", 10 * GiB, int(0.8 * 10 * GiB)),
        ("1", 4 * GiB, 4 * GiB),
        ("80%", 10 * GiB, int(0.8 * 10 * GiB)),
    ],
)
def test_parse_budget(text: str, total: int | None, expected: int) -> None:
    assert parse_budget(text, total) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "want bytes"),
        ("six gigs", "want bytes"),
        ("6XB", "want bytes"),
        ("-1GiB", "want bytes"),
        ("1.5", "whole"),
        ("0", "fraction"),
        ("150%", "fraction"),
        ("0.8", "device total is unknown"),
        ("0GiB", "positive"),
    ],
)
def test_parse_budget_rejects(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_budget(text, None if text == "0.8" else GiB)


def test_fit_recovers_known_line() -> None:
    base, per_token = 400 * MiB, 40 * 1024
    points = [(t, int(base + per_token * t)) for t in (16, 64, 256, 1024, 4096, 8192)]
    fit = fit_memory(points)
    assert fit.base_bytes == pytest.approx(base, rel=1e-6)
    assert fit.per_token_bytes == pytest.approx(per_token, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0) and fit.max_rel_err < 1e-6 and fit.n == 6


def test_fit_reports_error_of_noisy_points() -> None:
    points = [(100, 1000), (200, 2200), (300, 2900), (400, 4100)]
    fit = fit_memory(points)
    assert 0.9 < fit.r2 < 1.0
    assert fit.max_rel_err > 0.01
    with pytest.raises(ValueError, match="two sizes"):
        fit_memory([(100, 1), (100, 2)])


def test_ceiling_math_and_floor() -> None:
    fit = Fit(base_bytes=1 * GiB, per_token_bytes=1024, r2=1, max_rel_err=0, n=2)
    assert ceiling_for_budget(fit, 2 * GiB, 0.9) == int(0.9 * GiB / 1024)
    assert ceiling_for_budget(fit, 2 * GiB, 1.0) == GiB // 1024
    # A budget smaller than the weights still lets one longest item through.
    assert ceiling_for_budget(fit, GiB // 2, 0.9, min_tokens=256) == 256
    flat = Fit(base_bytes=GiB, per_token_bytes=0.0, r2=1, max_rel_err=0, n=2)
    with pytest.raises(ValueError, match="did not grow"):
        ceiling_for_budget(flat, 2 * GiB)


def test_latency_knee() -> None:
    # tokens/s doubles up to 1024 tokens, then stays flat (within 5%).
    points = [(t, t / min(t * 10, 10240)) for t in (64, 128, 256, 512, 1024, 2048, 4096)]
    assert latency_knee(points) == 1024
    # A late jump past 5% moves the knee there.
    assert latency_knee([(100, 1.0), (200, 1.0), (400, 1.0)]) == 400
    assert latency_knee([(100, 0.1)]) == 100


def _calibration(**overrides: object) -> Calibration:
    fields: dict[str, object] = dict(
        model="minilm", backend="torch", device="cuda:0", memory_source="test",
        fit=Fit(base_bytes=GiB, per_token_bytes=4096, r2=0.99, max_rel_err=0.03, n=3),
        margin=0.9, budget_bytes=2 * GiB, ceiling_tokens=235929, knee_tokens=2048,
        max_cost=256, device_total_bytes=16 * GiB, load_peak_bytes=GiB, steady_bytes=GiB,
        probes=[Probe(1, 16, 16, GiB, 0.01), Probe(64, 256, 16384, None, 0.0, oom=True)],
    )  # fmt: skip
    fields.update(overrides)
    return Calibration(**fields)  # type: ignore[arg-type]


def test_file_round_trip(tmp_path: Path) -> None:
    c = _calibration()
    path = save_calibration(tmp_path, c)
    assert path == calibration_path(tmp_path, "minilm", "torch", "cuda:0")
    assert path.name == "minilm-torch-cuda_0.json"  # device sanitised
    assert load_calibration(tmp_path, "minilm", "torch", "cuda:0") == c
    assert load_calibration(tmp_path, "minilm", "onnx", "cuda:0") is None
    path.write_text("{not json")
    assert load_calibration(tmp_path, "minilm", "torch", "cuda:0") is None
    path.write_text(json.dumps({"version": 999}))
    assert load_calibration(tmp_path, "minilm", "torch", "cuda:0") is None


def test_backend_key() -> None:
    assert cal.backend_key(Settings(_env_file=None)) == "torch"
    assert cal.backend_key(Settings(backend="onnx", onnx_variant="int8")) == "onnx-int8"
    assert cal.backend_key(Settings(dtype="float16")) == "torch-float16"


def test_resolve_ceiling_reasons(tmp_path: Path) -> None:
    explicit = Settings(data_dir=tmp_path, max_batch_tokens=4096)
    assert resolve_ceiling(explicit, "minilm", "cpu", 256) == (
        4096,
        "INFERQ_MAX_BATCH_TOKENS=4096 set explicitly",
        "",
    )
    n, why, _ = resolve_ceiling(Settings(data_dir=tmp_path, max_batch_tokens=100), "m", "cpu", 256)
    assert n == 256 and "raised to max_cost=256" in why

    plain = Settings(data_dir=tmp_path)
    n, why, _ = resolve_ceiling(plain, "minilm", "cpu", 256)
    assert n == 8192
    assert why == "default 8192: no calibration for minilm/torch/cpu (run `inferq calibrate`)"

    save_calibration(tmp_path, _calibration(device="cpu"))
    n, why, found = resolve_ceiling(plain, "minilm", "cpu", 256)  # the calibrated budget: 2 GiB
    assert found and '"device": "cpu"' in found  # the calibration it came from, for the beat
    assert n == int(0.9 * GiB / 4096)
    assert why.startswith(f"calibration {calibration_path(tmp_path, 'minilm', 'torch', 'cpu')}")
    assert "calibrated budget 2.0 GiB" in why and "fit err 3%" in why

    n2, why, _ = resolve_ceiling(plain, "minilm", "cpu", 256, streams=2)  # two batches at once
    assert n2 == n // 2 and why.endswith(f"÷ 2 batches at once → {n2}")

    budget = Settings(data_dir=tmp_path, memory_budget="0.25")  # of the recorded 16 GiB
    n, why, _ = resolve_ceiling(budget, "minilm", "cpu", 256)
    assert n == int(0.9 * 3 * GiB / 4096) and "INFERQ_MEMORY_BUDGET=0.25 = 4.0 GiB" in why

    tiny = Settings(data_dir=tmp_path, memory_budget="512MiB")
    n, why, _ = resolve_ceiling(tiny, "minilm", "cpu", 256)
    assert n == 256 and "raised to max_cost=256" in why

    save_calibration(tmp_path, _calibration(device="cpu", fit=Fit(GiB, 0.0, 1, 0, 2)))
    n, why, _ = resolve_ceiling(plain, "minilm", "cpu", 256)
    assert n == 8192 and why.startswith("default 8192: calibration") and "did not grow" in why


def test_the_ceiling_leaves_room_for_the_context_and_the_other_workers(tmp_path: Path) -> None:
    """The budget is the process's footprint: the context comes off it, and workers sharing
    the device split it before anything else."""
    save_calibration(tmp_path, _calibration(device="cuda:0", context_bytes=GiB // 2))
    s = Settings(data_dir=tmp_path, memory_budget="4GiB")
    n, why, _ = resolve_ceiling(s, "minilm", "cuda:0", 256)
    assert n == int(0.9 * (4 * GiB - GiB // 2 - GiB) / 4096)
    assert "less the CUDA context 512 MiB" in why
    two = Settings(data_dir=tmp_path, memory_budget="4GiB", workers_per_device=2)
    n2, why, _ = resolve_ceiling(two, "minilm", "cuda:0", 256)
    assert n2 == int(0.9 * (2 * GiB - GiB // 2 - GiB) / 4096)
    assert "÷ 2 workers on the device = 2.0 GiB" in why
    # A share that holds the context and the weights but nothing more: one longest item.
    three = Settings(data_dir=tmp_path, memory_budget="4GiB", workers_per_device=3)
    assert resolve_ceiling(three, "minilm", "cuda:0", 256).value == 256


def test_a_version_1_file_reads_with_no_context(tmp_path: Path) -> None:
    path = save_calibration(tmp_path, _calibration())
    raw = json.loads(path.read_text())
    del raw["context_bytes"]
    raw["version"] = 1
    path.write_text(json.dumps(raw))
    got = load_calibration(tmp_path, "minilm", "torch", "cuda:0")
    assert got is not None and got.context_bytes == 0 and got.version == 1


def test_device_share_and_allocator_fraction() -> None:
    assert cal.device_share(8 * GiB, 1) == 8 * GiB
    assert cal.device_share(8 * GiB, 3) == 8 * GiB // 3
    with pytest.raises(ValueError, match="at least 1"):
        cal.device_share(GiB, 0)
    assert cal.allocator_fraction(2 * GiB, GiB // 2, 16 * GiB) == pytest.approx(1.5 / 16)
    assert cal.allocator_fraction(32 * GiB, 0, 16 * GiB) == 1.0  # never past the device
    with pytest.raises(ValueError, match="raise INFERQ_MEMORY_BUDGET or run fewer workers"):
        cal.allocator_fraction(GiB // 2, GiB // 2, 16 * GiB)
