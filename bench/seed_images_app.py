"""The seed pattern for images: what a user writes today to serve a classifier.

FastAPI with the model in-process, images uploaded as multipart (`files: list[UploadFile]`,
the same body inferq's POST /v1/infer takes: parts named `files` and a `model` form field,
ignored here), and an `asyncio.Semaphore(4)` around each per-image call run in a thread:
decode + resize (the model's `prepare`) and the net, so the event loop stays responsive.
No batching. Env: BENCH_MODEL (efficientnet-lite0), BENCH_DEVICE, BENCH_BACKEND.
Run: `uvicorn inferq.bench.seed_images_app:app`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, File, Form, UploadFile

from inferq.bench.model import from_env
from inferq.worker.models.base import Input, InputKind

CONCURRENT_CALLS = 4


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.model = await asyncio.to_thread(from_env)
    app.state.sem = asyncio.Semaphore(CONCURRENT_CALLS)
    yield


app = FastAPI(lifespan=lifespan)


def classify(data: bytes) -> Any:
    model = app.state.model
    items = model.prepare([Input(InputKind.IMAGE, data)], {})
    return model.run([p.payload for p in items])[0]


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/infer")
async def infer(
    files: Annotated[list[UploadFile], File()],
    model: Annotated[str | None, Form()] = None,
) -> dict[str, Any]:
    outputs = []
    for upload in files:
        data = await upload.read()
        async with app.state.sem:
            outputs.append(await asyncio.to_thread(classify, data))
    return {"status": "succeeded", "outputs": outputs}
