"""The echo path's floors: what an HTTP API costs before it does any work of its own.

`floor-fastapi`: a bare FastAPI POST handler that answers at once. `floor-redis`: the same
handler plus one Redis round trip (a SET of the body and a GET of it, pipelined, so one round
trip that moves the payload both ways, the least a queue must do per request). Both read the
same `{"input": ...}` body as inferq's POST /v1/infer, answer `{"status": "succeeded"}`, and
run under uvicorn with inferq's API settings (httptools, uvloop, no access log, the same
keep-alive), on the same Redis client policy (`shared.redis_clients.api_client`, default
pool and timeouts), so inferq's p50 on the echo model divided by floor-redis's is the cost
of inferq's own path. Run: `python -m inferq.bench.floor_app fastapi|redis PORT [REDIS_URL]`.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

KINDS = ("fastapi", "redis")
# Not a key of inferq's layout (shared/keys.py): the floor runs on its own Redis server, and
# one fixed key keeps its memory flat however long the run.
FLOOR_KEY = "bench:floor"
FLOOR_TTL_S = 60


class Body(BaseModel):
    input: str | None = None


def create_app(kind: str, redis: Any = None, redis_url: str | None = None) -> FastAPI:
    """The floor `kind` (fastapi | redis). floor-redis takes a ready client (`redis`, tests) or
    opens one on `redis_url` in the lifespan; ValueError for an unknown kind or no Redis."""
    if kind not in KINDS:
        raise ValueError(f"unknown floor {kind!r}: want one of {KINDS}")
    if kind == "redis" and redis is None and redis_url is None:
        raise ValueError("floor-redis needs a Redis client or URL")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if redis_url is None:
            yield
            return
        from inferq.shared.redis_clients import api_client
        from inferq.shared.settings import Settings

        settings = Settings()
        app.state.redis = api_client(
            redis_url, timeout_s=settings.redis_timeout_s, pool_size=settings.redis_pool_size
        )
        try:
            yield
        finally:
            await app.state.redis.aclose()

    app = FastAPI(lifespan=lifespan)
    app.state.redis = redis

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    if kind == "fastapi":

        @app.post("/v1/infer")
        async def bare(body: Body) -> dict[str, str]:
            return {"status": "succeeded"}

    else:

        @app.post("/v1/infer")
        async def one_round_trip(body: Body) -> dict[str, str]:
            pipe = app.state.redis.pipeline(transaction=False)
            pipe.set(FLOOR_KEY, body.input or "", ex=FLOOR_TTL_S)
            pipe.get(FLOOR_KEY)
            await pipe.execute()
            return {"status": "succeeded"}

    return app


def main(argv: list[str]) -> None:
    import uvicorn

    from inferq.shared.settings import Settings

    kind, port = argv[0], int(argv[1])
    app = create_app(kind, redis_url=argv[2] if len(argv) > 2 else None)
    # inferq's API settings (api/main.py): only the app differs.
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=False,
        timeout_keep_alive=max(1, round(Settings().keepalive_s)),
        http="auto",
        log_level="warning",  # what the bench runs inferq's API at (INFERQ_LOG_LEVEL)
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main(sys.argv[1:])
