"""`inferq worker`: load one model on one device and serve its stream until SIGTERM."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import signal
import sys
import time

from prometheus_client import start_http_server

from inferq.shared.heap import freeze_startup
from inferq.shared.logs import setup_logging
from inferq.shared.metrics import worker_metrics
from inferq.shared.redis_clients import worker_client
from inferq.shared.settings import ModelSpec, Settings
from inferq.worker.build import WorkerPlan, build_worker
from inferq.worker.calibration.fit import resolve_ceiling
from inferq.worker.memory import EXPANDABLE, DeviceBound, bound_device, configure_allocator
from inferq.worker.models.base import Model, probe_inputs
from inferq.worker.models.registry import build_model
from inferq.worker.plan import (
    resolve_backend,
    resolve_device,
    resolve_dtype,
    settle_plan,
    thread_plan,
)

log = logging.getLogger("inferq.worker")


def load_model(
    spec: ModelSpec, settings: Settings, device: str, intra_op_threads: int = 0
) -> Model:
    t0 = time.perf_counter()
    if (
        intra_op_threads
        and importlib.util.find_spec("torch") is not None
        and spec.target == "minilm"
    ):
        import torch

        torch.set_num_threads(intra_op_threads)
    model = build_model(spec, settings, intra_op_threads=intra_op_threads)
    model.load(device)
    # Warm up once so the first user request does not pay for allocator growth.
    if (probe := probe_inputs(model, 8)) is not None:
        model.run([p.payload for p in model.prepare(*probe)])
    log.info(
        "loaded model=%s target=%s device=%s in %.1fs",
        spec.name,
        spec.target,
        device,
        time.perf_counter() - t0,
    )
    return model


async def serve(
    settings: Settings,
    model: Model,
    model_name: str,
    device: str,
    backend: str,
    model_threads: int = 1,
    bound: DeviceBound | None = None,
) -> bool:
    """Run the worker until SIGTERM/SIGINT; True if it drained within INFERQ_DRAIN_S."""
    redis = worker_client(
        settings.redis_url.get_secret_value(),
        block_ms=settings.read_block_ms,
        sentinels=settings.redis_sentinels,
        sentinel_master=settings.redis_sentinel_master,
        cluster=settings.redis_cluster,
        multiplex=settings.redis_multiplex,
    )
    ceiling, reason, calibration = resolve_ceiling(
        settings, model_name, device, model.max_cost, model_threads, model.default_batch_cost
    )
    log.info("token ceiling %d: %s", ceiling, reason)
    metrics = worker_metrics()
    metrics.token_ceiling.set(ceiling)
    if settings.worker_metrics_port:
        start_http_server(settings.worker_metrics_port, registry=metrics.registry)
        log.info("worker metrics on :%d/metrics", settings.worker_metrics_port)
    plan = WorkerPlan(
        device=device,
        backend=backend,
        ceiling=ceiling,
        ceiling_reason=reason,
        calibration=calibration,
        model_threads=model_threads,
        budget_bytes=bound.share_bytes if bound is not None else 0,
    )
    worker = build_worker(settings, model, model_name, redis, plan, metrics=metrics)
    # The model is loaded and the worker built: collections walk batches' objects only.
    log.debug("%d startup objects frozen", freeze_startup())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        return await worker.run()
    finally:
        await redis.aclose()


def main(settings: Settings, model: str | None = None) -> int:
    setup_logging(settings.log_level, settings.log_format)
    spec = ModelSpec(model) if model else settings.default_model
    if model and spec.name in settings.served_models and "=" not in model:
        spec = settings.served_models[spec.name]
    device = resolve_device(settings.device)
    settings = settings.model_copy(
        update={
            "backend": resolve_backend(settings.backend, device, spec.target),
            "device": device,
            "dtype": resolve_dtype(settings.dtype, device, spec.target),
        }
    )
    if device.startswith("cuda") and configure_allocator(os.environ):
        log.info("torch's CUDA allocator: PYTORCH_CUDA_ALLOC_CONF=%s", EXPANDABLE)
    model_threads, intra_op = thread_plan(settings, device, spec)
    if settings.snapshot_at is not None:
        from inferq.worker.memory import enable_history

        enable_history(device)  # so a snapshot says who allocated (CUDA only)
    loaded = load_model(spec, settings, device, intra_op)
    try:
        bound = bound_device(settings, spec.name, device)
    except ValueError as e:  # a share that cannot hold the CUDA context, a malformed budget
        log.error("cannot start: %s", e)
        return 2
    if bound is not None:
        log.info("%s", bound.describe())
    model_threads, intra_op = settle_plan(loaded, settings, (model_threads, intra_op))
    log.info(
        "model threads: %d batches at once, %s threads each", model_threads, intra_op or "default"
    )
    # The backend only means something for built-in models; a user's model is its own runtime.
    backend = settings.backend if spec.target == "minilm" else spec.target
    try:  # uvloop cuts the event loop's share of each job's overhead; optional
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        clean = runner.run(
            serve(settings, loaded, spec.name, device, backend, model_threads, bound)
        )
    if not clean:
        # A model thread may still be stuck on the device: a normal exit would wait for it
        # (non-daemon pool threads are joined at shutdown), so leave now, logs flushed.
        logging.shutdown()
        sys.stderr.flush()
        os._exit(3)
    return 0
