"""The built wheel installs one top-level package, `inferq`, with its data files.

Built once per module from the working tree (`pip wheel --no-deps`, no network), then
unpacked into a folder of its own and imported from a directory without sources, as a
user's `pip install inferq` would be: a bare `import api` must not resolve.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--wheel-dir", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (path,) = out.glob("inferq-*.whl")
    return path


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
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
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
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
