"""`scripts/stack_cpu.py --tree`: the servers import inferq from another checkout (the
"before" column of docs/benchmarks.md's CPU table comes from it), not from this one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.tools.scripts import load_script

stack_cpu = load_script("stack_cpu")


def test_tree_points_the_servers_imports_at_the_other_checkout(tmp_path: Path) -> None:
    tree, site = tmp_path / "before", tmp_path / "site"
    for package in ("inferq", "api"):
        (tree / package).mkdir(parents=True)
        (tree / package / "__init__.py").write_text("")
    (tree / "api" / "app.py").write_text("WHERE = 'the other tree'\n")
    site.mkdir()
    env = os.environ | stack_cpu.other_tree(tree, site)
    code = "import inferq.api.app as a; print(a.WHERE); print(a.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=site, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["the other tree", str(tree.resolve() / "api" / "app.py")]
