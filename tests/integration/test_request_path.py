"""The files one `POST /v1/infer` crosses, counted by running it: the API and a worker in this
process (one event loop; the model on the worker's own thread), against the session's real
Redis, with a profiler recording every inferq source file whose code runs from the request
to its answer. docs/architecture.md lists them; this keeps the list and its count honest.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from redis.asyncio import Redis

from inferq.api.app import create_app
from inferq.shared.settings import Settings
from tests.integration.inprocess import InProcess, Recorder

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "worker", "shared")
#: What the path crossed when this test was written (issue 29 wants it at most 20): a bound
#: that fails when the path grows; lower it as the path shrinks.
MAX_FILES = 22


class Crossed:
    """Every repository file whose code runs while `on` is set, on any thread."""

    def __init__(self) -> None:
        self.on = False
        self.files: set[str] = set()
        self._prefixes = tuple(str(ROOT / p) + "/" for p in PACKAGES)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.on and event == "call":
            name = frame.f_code.co_filename
            if name.startswith(self._prefixes):
                self.files.add(str(Path(name).relative_to(ROOT)))


async def test_one_infer_crosses_the_files_the_architecture_lists(redis_url: str) -> None:
    crossed = Crossed()
    threading.setprofile(crossed)  # the model threads, started by the worker below
    sys.setprofile(crossed)
    worker = InProcess(redis_url, Recorder(), heartbeat_s=30)
    settings = Settings(_env_file=None, redis_url=redis_url, model="echo", heartbeat_s=30)
    redis = Redis.from_url(redis_url)  # the app's; a client handed in is the caller's to close
    app = create_app(settings, redis=redis)
    try:
        await worker.start()
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                body = {"input": "the path of one request", "wait": 10}
                warm = await client.post("/v1/infer", json=body)  # first calls: lazy set-up
                assert warm.status_code == 200, warm.text
                crossed.on = True
                r = await client.post("/v1/infer", json=body)
                crossed.on = False
                assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        await worker.close()
        await redis.aclose()
    files = sorted(crossed.files)
    print(f"{len(files)} files:", *files, sep="\n  ")
    # The request's own stages are all there: the route, the pipeline, the queue, the worker.
    for must in ("api/routes/fast.py", "api/core/service.py", "worker/executor.py"):
        assert must in files, files
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("### The files one request crosses", 1)[1].split("\n## ", 1)[0]
    missing = [f for f in files if f"`{f}`" not in section]
    assert not missing, f"docs/architecture.md's request path does not list: {missing}"
    table = section.split("| stage | files |", 1)[1]
    stale = sorted(set(re.findall(r"`([\w/]+\.py)`", table)) - set(files))
    assert not stale, (
        f"docs/architecture.md's request path lists files it no longer crosses: {stale}"
    )
    assert f"**{len(files)} files**" in section, f"the section's count is not {len(files)}"
    assert len(files) <= MAX_FILES, files
