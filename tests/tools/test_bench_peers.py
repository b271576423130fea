"""The bench's peers and floors: Infinity's command lines and venv, the floor apps, the echo
plan and its ratios to floor-redis. Offline and fast: no server is started."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import fakeredis
import httpx
import pytest

from inferq.bench import floor_app, load, report, systems
from inferq.bench import infinity as inf
from inferq.bench import main as bench_main
from inferq.bench.http import Body
from inferq.bench.procs import BenchError
from inferq.bench.runner import Plan, run_once

# --- Infinity ---


def test_infinity_torch_command_line() -> None:
    argv = inf.argv(Path("/v"), "torch", "/m", 7997)
    assert argv == [
        "/v/bin/infinity_emb", "v2", "--model-id", "/m", "--engine", "torch", "--device", "cpu",
        "--batch-size", "32", "--host", "127.0.0.1", "--port", "7997", "--log-level", "warning",
    ]  # fmt: skip


def test_infinity_optimum_command_line_sets_what_0_0_78_needs() -> None:
    argv = inf.argv(Path("/v"), "optimum", ".", 1, "cuda:1")
    assert argv[argv.index("--model-id") + 1] == "."
    assert argv[argv.index("--engine") + 1] == "optimum"
    assert argv[argv.index("--device") + 1 : argv.index("--device") + 4] == [
        "cuda", "--device-id", "1"
    ]  # fmt: skip
    assert argv[-3:] == ["--pooling-method", "mean", "--onnx-disable-optimize"]
    with pytest.raises(ValueError, match="unknown Infinity engine"):
        inf.argv(Path("/v"), "ctranslate2", "/m", 1)


def test_infinity_env_is_offline_and_drops_the_callers_infinity_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INFINITY_BATCH_SIZE", "4")
    monkeypatch.setenv("INFERQ_MODEL", "echo")
    env = inf.env({"OMP_NUM_THREADS": "2"})
    assert env["HF_HUB_OFFLINE"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert env["INFINITY_ANONYMOUS_USAGE_STATS"] == "0" and env["OMP_NUM_THREADS"] == "2"
    assert "INFINITY_BATCH_SIZE" not in env and "INFERQ_MODEL" not in env


def test_venv_location_and_missing_message(tmp_path: Path) -> None:
    assert inf.venv({}) == Path.cwd() / ".venv-infinity"
    assert inf.venv({inf.VENV_ENV: str(tmp_path)}) == tmp_path
    why = inf.missing(tmp_path)
    assert why is not None and "make bench-infinity" in why and str(tmp_path) in why
    exe = inf.executable(tmp_path)
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    assert inf.missing(tmp_path) is None


def test_model_dir_is_the_wheel_inferq_loads() -> None:
    d = inf.model_dir()
    assert (d / "config.json").is_file() and (d / "model.safetensors").is_file()


def test_a_missing_venv_skips_infinity_with_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(inf.VENV_ENV, str(tmp_path / "absent"))
    with pytest.raises(BenchError, match="no Infinity at"):
        systems.infinity(tmp_path, "infinity", "cpu", {})
    plan = Plan(("short",), (1,), 0.1, 0.0, "cpu", "torch", ("infinity",))
    notes: list[str] = []
    rows = run_once(plan, tmp_path / "logs", lambda _: None, notes.append)
    assert rows == []
    assert len(notes) == 1 and notes[0].startswith("skipping infinity (minilm): no Infinity at")


def _fake_optimum_cli(venv: Path, script: str) -> None:
    cli = venv / "bin" / "optimum-cli"
    cli.parent.mkdir(parents=True, exist_ok=True)
    cli.write_text("#!/bin/sh\n" + script)
    cli.chmod(0o755)


def test_onnx_export_runs_once_into_the_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # The last argument is the target directory, as optimum-cli takes it.
    _fake_optimum_cli(venv, 'for a; do t="$a"; done; mkdir -p "$t"; echo x > "$t/model.onnx"\n')
    out = inf.ensure_onnx(venv, tmp_path / "model", tmp_path / "export.log")
    assert out == inf.onnx_dir(venv) and (out / "model.onnx").read_text() == "x\n"
    assert not out.with_name(out.name + ".tmp").exists()
    _fake_optimum_cli(venv, "exit 3\n")  # cached: not run again
    assert inf.ensure_onnx(venv, tmp_path / "model", tmp_path / "export.log") == out


def test_a_failed_onnx_export_says_so(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _fake_optimum_cli(venv, "echo boom; exit 3\n")
    with pytest.raises(BenchError, match=r"(?s)export failed \(3\).*boom"):
        inf.ensure_onnx(venv, tmp_path / "model", tmp_path / "export.log")
    assert not inf.onnx_dir(venv).exists()
    assert inf.export_argv(venv, Path("/m"), Path("/t"))[1:] == [
        "export", "onnx", "--model", "/m", "--task", "feature-extraction",
        "--library-name", "transformers", "/t",
    ]  # fmt: skip


def test_cosines() -> None:
    assert inf.cosines([[1.0, 0.0], [1.0, 1.0]], [[2.0, 0.0], [1.0, -1.0]]) == [1.0, 0.0]
    assert inf.cosines([[0.0, 0.0]], [[1.0, 0.0]]) == [0.0]
    with pytest.raises(ValueError, match="1 vectors against 2"):
        inf.cosines([[1.0]], [[1.0], [1.0]])


@pytest.mark.parametrize(("worst", "ok"), [(0.99995, True), (0.998, False)])
def test_agreement_threshold(monkeypatch: pytest.MonkeyPatch, worst: float, ok: bool) -> None:
    def fake_run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        assert cmd[1:] == ["-m", "inferq.bench.infinity", "http://127.0.0.1:1", "cpu"]
        return subprocess.CompletedProcess(cmd, 0, json.dumps({"min_cosine": worst}) + "\n", "")

    monkeypatch.setattr(inf.subprocess, "run", fake_run)
    if ok:
        assert inf.agreement("http://127.0.0.1:1", "cpu", {}) == worst
    else:
        with pytest.raises(BenchError, match=r"differ from inferq.s: cosine 0\.99800"):
            inf.agreement("http://127.0.0.1:1", "cpu", {})


class _Recorder:
    """A bench.http.Connection stand-in that records the route and answers 200."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        content_type: str = "",
        accept: str | None = None,
    ) -> tuple[int, bytes]:
        self.paths.append(path)
        return 200, b'{"status":"succeeded"}'


@pytest.mark.parametrize(
    ("kind", "path"),
    [("infinity", "/embeddings"), ("litserve", "/predict"), ("floor-redis", "/v1/infer"),
     ("floor-fastapi", "/v1/infer"), ("seed", "/v1/infer"), ("infer", "/v1/infer")],
)  # fmt: skip
async def test_each_kind_posts_to_its_route(kind: str, path: str) -> None:
    conn = _Recorder()
    await load._one(conn, kind, Body(b'{"input":"x"}'))  # type: ignore[arg-type]
    assert conn.paths == [path]


async def test_submit_posts_a_job_and_wants_202() -> None:
    conn = _Recorder()
    with pytest.raises(RuntimeError, match="submit answered 200"):
        await load._one(conn, "submit", Body(b'{"input":"x"}'))  # type: ignore[arg-type]
    assert conn.paths == ["/v1/jobs"]

    async def accepted(*_: Any) -> tuple[int, bytes]:
        return 202, b'{"id":"j","status":"queued"}'

    conn.request = accepted  # type: ignore[method-assign]
    assert await load._one(conn, "submit", Body(b'{"input":"x"}')) is None  # type: ignore[arg-type]


# --- floors ---


async def _post(app: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://floor") as client:
        assert (await client.get("/healthz")).status_code == 200
        return await client.post("/v1/infer", json={"input": "hello world"})


async def test_floor_fastapi_answers_at_once() -> None:
    answer = await _post(floor_app.create_app("fastapi"))
    assert answer.status_code == 200 and answer.json() == {"status": "succeeded"}


async def test_floor_redis_makes_its_round_trip() -> None:
    redis = fakeredis.FakeAsyncRedis()
    answer = await _post(floor_app.create_app("redis", redis=redis))
    assert answer.status_code == 200 and answer.json() == {"status": "succeeded"}
    assert await redis.get(floor_app.FLOOR_KEY) == b"hello world"
    assert 0 < await redis.ttl(floor_app.FLOOR_KEY) <= floor_app.FLOOR_TTL_S
    await redis.aclose()


def test_floor_apps_refuse_what_they_cannot_run() -> None:
    with pytest.raises(ValueError, match="unknown floor 'grpc'"):
        floor_app.create_app("grpc")
    with pytest.raises(ValueError, match="needs a Redis"):
        floor_app.create_app("redis")
    with pytest.raises(BenchError, match="unknown floor"):
        systems.floor(Path("."), "floor-nginx", {})


# --- the echo plan and its ratios ---


def test_echo_corpus_plan() -> None:
    plan = bench_main.plan_from(bench_main.BenchOptions(corpus="echo", concurrency="1,32"))
    assert plan.models() == {"echo": ["echo"]}
    assert plan.served("echo") == ["inferq", "floor-fastapi", "floor-redis"]
    assert plan.idle() == ["seed", "litserve", "infinity"]
    # (inferq, inferq-jobs, 2 floors) × 2 loads, no ceiling, no open loop; 2 front-end points
    assert plan.points() == 4 * 2 + 2
    with_submit = bench_main.BenchOptions(
        corpus="echo", concurrency="1", systems="inferq,jobs,submit,floor-redis"
    )
    # (inferq, inferq-jobs, inferq-submit, floor-redis) × 1 load
    assert bench_main.plan_from(with_submit).points() == 4
    both = bench_main.plan_from(bench_main.BenchOptions(corpus="short,echo"))
    assert both.unserved("echo") == ["seed", "litserve", "infinity"]
    assert both.unserved("minilm") == ["floor-fastapi", "floor-redis"]
    assert bench_main.plan_from(bench_main.BenchOptions()).unserved("minilm") == []


def test_systems_are_checked_and_idle_ones_noted() -> None:
    with pytest.raises(ValueError, match=r"unknown system\(s\) \['vllm'\]"):
        bench_main.plan_from(bench_main.BenchOptions(systems="inferq,vllm"))
    opts = bench_main.BenchOptions(systems="floor-redis,inferq,infinity")
    plan = bench_main.plan_from(opts)
    assert plan.served("minilm") == ["inferq", "infinity"]
    assert bench_main.idle_notes(opts, plan) == [
        "floor-redis is not run: it measures --corpus echo only"
    ]
    default = bench_main.BenchOptions()
    assert bench_main.idle_notes(default, bench_main.plan_from(default)) == []
    echo = bench_main.BenchOptions(corpus="echo", systems="infinity")
    assert bench_main.idle_notes(echo, bench_main.plan_from(echo)) == [
        "infinity is not run: it measures --corpus short,mixed only"
    ]


def _row(system: str, load_: Any, p50: float, ips: float) -> dict[str, Any]:
    return {"system": system, "corpus": "echo", "mode": "closed", "load": load_,
            "p50_ms": p50, "items_per_s": ips}  # fmt: skip


def test_floor_ratios_and_echo_report() -> None:
    rows = [
        _row("inferq", 1, 6.0, 150.0),
        _row("inferq-jobs", 1, 9.0, 100.0),
        _row("floor-fastapi", 1, 0.5, 1500.0),
        _row("floor-redis", 1, 1.5, 600.0),
        _row("inferq", 32, 30.0, 900.0),
        _row("floor-redis", 32, 10.0, 3000.0),
        _row("inferq-jobs", 32, 40.0, 700.0),
        _row("inferq", 128, 80.0, 1000.0),  # no floor point at 128
    ]
    ratios = {(r["system"], r["load"]): r for r in report.floor_ratios(rows, "echo")}
    assert ("floor-redis", 1) not in ratios
    assert ratios["inferq", 1]["p50_ratio"] == 4.0 and ratios["inferq", 1]["items_ratio"] == 0.25
    assert ratios["floor-fastapi", 1]["p50_ratio"] == pytest.approx(1 / 3)
    assert ratios["inferq", 32]["p50_ratio"] == 3.0
    assert math.isnan(ratios["inferq", 128]["p50_ratio"])
    table = report.floor_table(list(ratios.values()))
    assert "| inferq | 1 | 6.00 | 1.50 | 4.0× | 0.25 |" in table
    assert "| inferq | 128 | 80.00 | – | – | – |" in table
    got = {what: value for what, value, _ in report.targets(rows, ["echo"])}
    assert got["echo: inferq p50 ÷ floor-redis p50 at 1 client (report)"] == "4.0×"
    assert got["echo: inferq-jobs p50 ÷ floor-redis p50 at 32 clients (report)"] == "4.0×"
    md = report.markdown(rows, ["echo"], "t", "machine")
    assert "#### `echo`: the path's cost against floor-redis" in md
    assert "queue overhead" not in md  # the text corpora's targets are not asked of echo


def test_infinity_targets_appear_only_when_measured() -> None:
    base = [{"system": "inferq", "corpus": "short", "mode": "closed", "load": 32,
             "items_per_s": 150.0}]  # fmt: skip
    assert not any("infinity" in w for w, _, _ in report.targets(base, ["short"]))
    peer = {"system": "infinity", "corpus": "short", "mode": "closed", "load": 32,
            "items_per_s": 100.0, "min_cosine": 0.99999}  # fmt: skip
    got = {w: (v, ok) for w, v, ok in report.targets([*base, peer], ["short"])}
    assert got["short: inferq ÷ infinity at 32 clients (report)"] == ("1.50", "–")
    assert got["infinity: min cosine against inferq's vectors (≥ 0.999)"] == ("0.99999", "met")
