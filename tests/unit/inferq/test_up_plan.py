"""`inferq up --devices/--workers`: which workers start, on which device, under which id."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferq import up
from inferq.redis_server import RedisServer


def test_one_worker_and_no_devices_changes_nothing() -> None:
    assert up.plan_workers(None, 1, model_name="echo", env={}) == [("worker", {})]


def test_one_worker_per_device_each_with_a_stable_distinct_id() -> None:
    plan = up.plan_workers(["cuda:0", "cuda:1"], 1, model_name="minilm", env={}, host="gpu1")
    one = {"INFERQ_WORKERS_PER_DEVICE": "1"}
    assert plan == [
        ("worker cuda:0 #0", {"INFERQ_DEVICE": "cuda:0", "INFERQ_WORKER_ID": "gpu1:cuda:0:minilm:0"} | one),
        ("worker cuda:1 #0", {"INFERQ_DEVICE": "cuda:1", "INFERQ_WORKER_ID": "gpu1:cuda:1:minilm:0"} | one),
    ]  # fmt: skip


def test_workers_on_the_cpu_split_its_cores() -> None:
    plan = up.plan_workers(["cpu"], 3, model_name="echo", env={}, cores=8, host="h")
    assert [o["INFERQ_WORKER_ID"] for _, o in plan] == [
        "h:cpu:echo:0",
        "h:cpu:echo:1",
        "h:cpu:echo:2",
    ]
    assert all(
        o["INFERQ_MODEL_THREADS"] == "1" and o["INFERQ_INTRA_OP_THREADS"] == "2" for _, o in plan
    )


def test_explicit_thread_settings_and_worker_id_are_kept() -> None:
    env = {"INFERQ_MODEL_THREADS": "2", "INFERQ_INTRA_OP_THREADS": "3", "INFERQ_WORKER_ID": "w"}
    plan = up.plan_workers(None, 2, model_name="echo", env=env | {"INFERQ_DEVICE": "cpu"}, cores=8)
    assert [o["INFERQ_WORKER_ID"] for _, o in plan] == ["w:cpu:echo:0", "w:cpu:echo:1"]
    assert all(
        o["INFERQ_MODEL_THREADS"] == "2" and o["INFERQ_INTRA_OP_THREADS"] == "3" for _, o in plan
    )


def test_gpu_workers_get_no_thread_split_and_split_the_devices_budget() -> None:
    plan = up.plan_workers(["cuda:0"], 2, model_name="echo", env={}, cores=8)
    assert all("INFERQ_INTRA_OP_THREADS" not in o for _, o in plan)
    assert [o["INFERQ_WORKERS_PER_DEVICE"] for _, o in plan] == ["2", "2"]
    plan = up.plan_workers(["cuda:0", "cuda:1"], 3, model_name="echo", env={}, cores=8)
    assert {o["INFERQ_WORKERS_PER_DEVICE"] for _, o in plan} == {"3"}


def test_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    assert up.resolve_devices(None) is None
    assert up.resolve_devices("cuda:0, cuda:1") == ["cuda:0", "cuda:1"]
    monkeypatch.setattr(up, "cuda_devices", lambda: [])
    assert up.resolve_devices("all") == ["cpu"]  # no GPU: one worker on the CPU
    monkeypatch.setattr(up, "cuda_devices", lambda: ["cuda:0", "cuda:1"])
    assert up.resolve_devices("all") == ["cuda:0", "cuda:1"]
    for bad in ("", "gpu0", "cuda:x", "cpu,,tpu"):
        with pytest.raises(ValueError, match="want 'all'"):
            up.resolve_devices(bad)
    with pytest.raises(ValueError, match="--workers"):
        up.plan_workers(None, 0, model_name="echo", env={})


def test_auto_model_threads_count_as_one_per_worker() -> None:
    plan = up.plan_workers(
        ["cpu"], 2, model_name="echo", env={"INFERQ_MODEL_THREADS": "0"}, cores=4
    )
    assert all(
        o["INFERQ_MODEL_THREADS"] == "1" and o["INFERQ_INTRA_OP_THREADS"] == "2" for _, o in plan
    )


def test_redis_maxmemory_is_bytes_or_a_share_of_the_machine() -> None:
    gib = 2**30
    assert up.redis_maxmemory("25%", 16 * gib) == 4 * gib
    assert up.redis_maxmemory("0.5", 16 * gib) == 8 * gib
    assert up.redis_maxmemory("2gb", 16 * gib) == 2 * 10**9
    assert up.redis_maxmemory("512MiB", 16 * gib) == 512 * 2**20
    with pytest.raises(ValueError, match="INFERQ_REDIS_MAXMEMORY"):
        up.redis_maxmemory("lots", 16 * gib)
    server = RedisServer(Path("/tmp/x"), port=1, maxmemory=123)
    argv = server.command()
    assert argv[argv.index("--maxmemory") + 1] == "123"
    assert argv[argv.index("--maxmemory-policy") + 1] == "noeviction"


def test_default_scale_one_of_each_on_a_cpu_host_more_on_a_gpu_host() -> None:
    assert up.default_scale(0, 2) == (1, 1)
    assert up.default_scale(0, 64) == (1, 1)  # a big CPU host: as before
    assert up.default_scale(1, 16) == (2, 6)  # the H200 host: 2 workers, 6 APIs, 1 for Redis
    assert up.default_scale(1, 4) == (2, 1)  # never below one API
    assert up.default_scale(8, 128) == (2, 16)  # capped


def test_host_gpus_counts_cuda_devices_given_or_found(monkeypatch: pytest.MonkeyPatch) -> None:
    assert up.host_gpus(["cuda:0", "cuda:1", "cpu"], "auto") == 2
    assert up.host_gpus(None, "cpu") == 0  # INFERQ_DEVICE=cpu: no probe at all
    monkeypatch.setattr(up, "cuda_devices", lambda: ["cuda:0", "cuda:1"])
    monkeypatch.setattr(up.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert up.host_gpus(None, "auto") == 1  # INFERQ_DEVICE's one device
    monkeypatch.setattr(up, "cuda_devices", lambda: [])
    assert up.host_gpus(None, "cuda") == 0
