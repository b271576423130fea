"""`scripts/call_count.py`: it counts the calls of a real request's path (API and worker in
one process against a redis-server it starts), and files each under its package."""

from __future__ import annotations

from pathlib import Path

from tests.tools.scripts import load_script

call_count = load_script("call_count")
ROOT = Path(__file__).resolve().parents[2]


def test_calls_are_filed_under_their_package() -> None:
    package = call_count.package
    assert package(str(ROOT / "api" / "routes" / "fast.py")) == "inferq api"
    assert package(str(ROOT / "worker" / "book.py")) == "inferq worker"
    assert package("/x/.venv/lib/python3.11/site-packages/redis/asyncio/client.py") == "redis"
    assert package("/x/.venv/lib/python3.11/site-packages/six.py") == "six"
    assert package("/usr/lib/python3.11/asyncio/base_events.py") == "asyncio"
    assert package("<frozen abc>") == "<frozen abc>"


async def test_it_counts_both_sides_of_real_requests() -> None:
    calls = await call_count.main(clients=2, requests=3, top=5, inputs=3)  # "inputs": a list
    files = {str(Path(f).relative_to(ROOT)) for f, _ in calls if Path(f).is_relative_to(ROOT)}
    # The request's own stages: the hot route, the pipeline, the worker's run and write-back.
    for stage in ("api/routes/fast.py", "api/core/service.py", "worker/executor.py"):
        assert stage in files, sorted(files)
    assert not any(f.startswith("scripts/") for f in files)  # the driver is not counted
    assert calls[(str(ROOT / "api" / "core" / "service.py"), "JobService.create")] >= 6


def test_on_uvloop_the_loops_own_machinery_is_not_python() -> None:
    import uvloop

    calls = uvloop.run(call_count.main(clients=1, requests=2, top=1))
    on_loop = {q for f, q in calls if f.endswith("asyncio/base_events.py")}
    assert "BaseEventLoop.call_soon" not in on_loop  # uvloop's own, in C
    assert calls[(str(ROOT / "api" / "core" / "service.py"), "JobService.create")] >= 2
