"""The client is installable without the server: its modules import the standard library,
httpx, numpy and each other, nothing else (no redis, pydantic, FastAPI, no api/worker/shared);
and its public names are pinned."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import inferq.client

CLIENT = Path(__file__).resolve().parents[3] / "client"
ALLOWED = {"httpx", "numpy", "__future__", *sys.stdlib_module_names}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_client_imports_nothing_of_the_server() -> None:
    modules = sorted(CLIENT.glob("*.py"))
    assert len(modules) >= 8
    bad = {
        f"{path.name} → {name}"
        for path in modules
        for name in _imports(path)
        if name.split(".")[0] not in ALLOWED and not name.startswith("inferq.client")
    }
    assert not bad, f"the client must not need the server's dependencies: {sorted(bad)}"


def test_public_names() -> None:
    assert set(inferq.client.__all__) == {
        "APIError", "AsyncClient", "BadRequest", "Client", "Conflict", "Forbidden",
        "InferqError", "InvalidResponse", "Job", "JobError", "JobFailed", "JobStatus",
        "NotFound", "Overloaded", "RetryPolicy", "ServerError", "Timings", "TransportError",
        "Unauthorized", "Unavailable", "WaitTimeout",
    }  # fmt: skip
    assert all(hasattr(inferq.client, name) for name in inferq.client.__all__)


def test_importing_the_client_loads_no_server_module() -> None:
    probe = (
        "import sys, inferq.client; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'redis', 'pydantic', 'fastapi', 'starlette', 'torch', 'msgpack'} "
        "or m.startswith(('inferq.api', 'inferq.worker', 'inferq.shared'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
