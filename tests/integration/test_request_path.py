"""The files one `POST /v1/infer` crosses, counted by running it: the API and a worker in this
process (one event loop; the model on the worker's own thread), against the session's real
Redis, with a profiler recording every inferq source file whose code runs from the request
to its answer. docs/architecture.md lists them; this keeps the list and its count honest.

The count runs from the route to the model call, as issue 29 words it: the model's own code
(`worker/models/`: the model and the helpers it calls) is whatever model is served, so it is
recorded and listed apart, and the test checks that the path enters it only through the
`Model` protocol's methods: a helper the worker itself called there would count.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from inferq.api.app import create_app
from inferq.shared.redis_clients import api_client
from inferq.shared.settings import Settings
from tests.integration.inprocess import InProcess, Recorder

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "worker", "shared")
MODELS = "worker/models/"
#: Issue 29's bound on the path (43 files at 964d439, models included): it fails when the
#: path grows; lower it as the path shrinks.
MAX_FILES = 20
#: How the path may enter the model's code: the `Model` protocol (`worker/models/base.py`).
MODEL_CALLS = {"load", "prepare", "run", "prepare_many"}


class Crossed:
    """Every repository file whose code runs while `on` is set, on any thread."""

    def __init__(self) -> None:
        self.on = False
        self.files: set[str] = set()
        self.model_files: set[str] = set()  # past the model call
        self.model_calls: set[str] = set()  # where the path entered the model's code
        self._prefixes = tuple(str(ROOT / p) + "/" for p in PACKAGES)
        self._models = str(ROOT / MODELS)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.on and event == "call":
            name = frame.f_code.co_filename
            if not name.startswith(self._prefixes):
                return
            if not name.startswith(self._models):
                self.files.add(str(Path(name).relative_to(ROOT)))
                return
            self.model_files.add(str(Path(name).relative_to(ROOT)))
            caller = frame.f_back
            if caller is None or not caller.f_code.co_filename.startswith(self._models):
                self.model_calls.add(frame.f_code.co_name)


async def test_one_infer_crosses_the_files_the_architecture_lists(redis_url: str) -> None:
    crossed = Crossed()
    threading.setprofile(crossed)  # the model threads, started by the worker below
    sys.setprofile(crossed)
    worker = InProcess(redis_url, Recorder(), heartbeat_s=30)
    settings = Settings(_env_file=None, redis_url=redis_url, model="echo", heartbeat_s=30)
    # The app's, as `api.app.connect` builds it (the scripts on one multiplexed connection);
    # a client handed in is the caller's to close.
    redis = api_client(redis_url, timeout_s=2, pool_size=8, multiplex=settings.redis_multiplex)
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
    files, model = sorted(crossed.files), sorted(crossed.model_files)
    print(f"{len(files)} files:", *files, f"and the model's {len(model)}:", *model, sep="\n  ")
    # The model's code is entered through the Model protocol only, and it ran.
    assert crossed.model_calls and crossed.model_calls <= MODEL_CALLS, crossed.model_calls
    # The request's own stages are all there: the route, the pipeline, the queue, the worker.
    for must in ("api/routes/fast.py", "api/core/service.py", "worker/executor.py"):
        assert must in files, files
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("### The files one request crosses", 1)[1].split("\n## ", 1)[0]
    missing = [f for f in files + model if f"`{f}`" not in section]
    assert not missing, f"docs/architecture.md's request path does not list: {missing}"
    table = section.split("| stage | files |", 1)[1]
    stale = sorted(set(re.findall(r"`([\w/]+\.py)`", table)) - set(files + model))
    assert not stale, (
        f"docs/architecture.md's request path lists files it no longer crosses: {stale}"
    )
    assert f"**{len(files)} files**" in section, f"the section's count is not {len(files)}"
    assert len(files) <= MAX_FILES, files
