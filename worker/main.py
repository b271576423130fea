"""`inferq worker`: load one model on one device and serve its stream until SIGTERM."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import signal
import time

from shared.logs import setup_logging
from shared.redis_conn import worker_client
from shared.settings import ModelSpec, Settings
from worker.models.base import Model
from worker.models.registry import build_model
from worker.service import Worker

log = logging.getLogger("inferq.worker")


def resolve_device(requested: str) -> str:
    """'auto' → 'cuda' when torch sees a GPU, else 'cpu'; torch is only imported if present."""
    if requested != "auto":
        return requested
    if importlib.util.find_spec("torch") is None:
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(spec: ModelSpec, settings: Settings, device: str) -> Model:
    t0 = time.perf_counter()
    model = build_model(spec, settings)
    model.load(device)
    # Warm up once so the first user request does not pay for allocator growth.
    model.run([p.payload for p in model.prepare(["inferq warm-up"])])
    log.info(
        "loaded model=%s target=%s device=%s in %.1fs",
        spec.name,
        spec.target,
        device,
        time.perf_counter() - t0,
    )
    return model


async def serve(settings: Settings, model: Model, model_name: str, device: str) -> None:
    redis = worker_client(settings.redis_url.get_secret_value(), block_ms=settings.read_block_ms)
    worker = Worker(settings, model, model_name, redis, device=device)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        await worker.run()
    finally:
        await redis.aclose()


def main(settings: Settings, model: str | None = None) -> int:
    setup_logging(settings.log_level, settings.log_format)
    spec = ModelSpec(model) if model else settings.default_model
    if model and spec.name in settings.served_models and "=" not in model:
        spec = settings.served_models[spec.name]
    device = resolve_device(settings.device)
    loaded = load_model(spec, settings, device)
    asyncio.run(serve(settings, loaded, spec.name, device))
    return 0
