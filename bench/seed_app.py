"""The seed pattern, the honest baseline: what a user writes today.

FastAPI with the model in-process and an `asyncio.Semaphore(4)` around each per-input
model call, the call run in a thread so the event loop stays responsive. No batching.
Same request shape as inferq's POST /v1/infer. Env: BENCH_DEVICE, BENCH_BACKEND.
Run: `uvicorn inferq.bench.seed_app:app`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from inferq.bench.model import from_env

CONCURRENT_CALLS = 4


class Body(BaseModel):
    input: str | None = None
    inputs: list[str] | None = None


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.model = await asyncio.to_thread(from_env)
    app.state.sem = asyncio.Semaphore(CONCURRENT_CALLS)
    yield


app = FastAPI(lifespan=lifespan)


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/infer")
async def infer(body: Body) -> dict[str, Any]:
    model = app.state.model
    texts = body.inputs if body.inputs is not None else [body.input or ""]
    outputs = []
    for text in texts:
        async with app.state.sem:
            items = model.prepare_texts([text])
            out = await asyncio.to_thread(model.run, [p.payload for p in items])
        outputs.append(out[0].tolist())
    return {"status": "succeeded", "outputs": outputs}
