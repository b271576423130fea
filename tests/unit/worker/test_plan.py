"""How many batches the worker runs at once, and on how many threads each."""

from __future__ import annotations

import pytest

from inferq.shared.settings import ModelSpec, Settings
from inferq.worker import plan as main
from inferq.worker.plan import settle_plan, thread_plan

MINILM, ECHO, USER = ModelSpec("minilm"), ModelSpec("echo"), ModelSpec("x=pkg.mod:Model")


@pytest.mark.parametrize(
    ("cores", "expected"), [(1, (1, 0)), (2, (2, 1)), (4, (4, 1)), (16, (4, 4)), (6, (4, 1))]
)
def test_auto_on_cpu_one_batch_per_core_up_to_four(
    monkeypatch: pytest.MonkeyPatch, cores: int, expected: tuple[int, int]
) -> None:
    monkeypatch.setattr(main, "cpu_cores", lambda: cores)
    assert thread_plan(Settings(_env_file=None), "cpu", MINILM) == expected
    assert thread_plan(Settings(_env_file=None, backend="onnx"), "cpu", MINILM) == expected


def test_one_batch_at_a_time_where_batches_would_contend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(main, "cpu_cores", lambda: 8)
    plain = Settings(_env_file=None)
    assert thread_plan(plain, "cuda", MINILM) == (1, 0)  # one device, one stream
    assert thread_plan(plain, "cpu", ECHO) == (1, 0)
    assert thread_plan(plain, "cpu", USER) == (1, 0)  # may hold the GIL
    assert thread_plan(Settings(_env_file=None, torchscript=False), "cpu", MINILM) == (1, 0)


def test_explicit_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(main, "cpu_cores", lambda: 8)
    s = Settings(_env_file=None, model_threads=3, intra_op_threads=5)
    assert thread_plan(s, "cpu", USER) == (3, 5)
    assert thread_plan(Settings(_env_file=None, model_threads=2), "cpu", MINILM) == (2, 4)
    assert thread_plan(Settings(_env_file=None, intra_op_threads=1), "cuda", MINILM) == (1, 1)


class Eager:
    traced = False


class Traced:
    traced = True


def test_eager_fallback_returns_to_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(main, "cpu_cores", lambda: 2)
    auto = Settings(_env_file=None)
    try:
        assert settle_plan(Traced(), auto, (2, 1)) == (2, 1)
        assert settle_plan(object(), auto, (2, 1)) == (2, 1)  # not minilm-on-torch: as planned
        assert settle_plan(Eager(), Settings(_env_file=None, model_threads=2), (2, 1)) == (2, 1)
        assert settle_plan(Eager(), auto, (2, 1)) == (1, 0)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_dtype_auto_is_float16_for_minilm_on_cuda_only() -> None:
    from inferq.worker.plan import resolve_dtype

    assert resolve_dtype("auto", "cuda", "minilm") == "float16"
    assert resolve_dtype("auto", "cuda:1", "minilm") == "float16"
    assert resolve_dtype("auto", "cpu", "minilm") == "float32"
    assert resolve_dtype("auto", "cuda", "efficientnet-lite0") == "float32"
    assert resolve_dtype("float32", "cuda", "minilm") == "float32"  # an explicit choice stays
