"""The worker's composition root: every part of a worker is built here and nowhere else.

`build_worker` turns settings, a loaded model, a Redis client and the start-up plan (device,
backend, token ceiling, thread count, memory share) into the parts (`WorkerParts`) and hands
them to `Worker`, which only runs them. A test that needs a worker with a fake clock or no
metrics builds it through here too, so what it runs is what production runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from inferq.shared.consumer import JobConsumer
from inferq.shared.jobs import Clock, SystemClock
from inferq.shared.metrics import WorkerMetrics
from inferq.shared.registry import ModelInfo, WorkerRegistry
from inferq.shared.settings import Settings
from inferq.worker.book import Book, Outbox
from inferq.worker.executor import Executor
from inferq.worker.heartbeat import Heartbeat
from inferq.worker.intake import Intake
from inferq.worker.models.base import Model, model_version
from inferq.worker.policy.scheduler import LiveCeiling, Scheduler
from inferq.worker.runtime import Worker, WorkerIdentity, WorkerParts
from inferq.worker.telemetry import Telemetry


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """What start-up decided for this worker (`inferq.worker.main`)."""

    device: str
    backend: str = ""
    ceiling: int | None = None  # token ceiling; None: INFERQ_MAX_BATCH_TOKENS
    ceiling_reason: str = ""  # where the ceiling came from (calibration, setting)
    calibration: str = ""  # the calibration file's summary, shown by the heartbeat
    model_threads: int = 1  # batches allowed on the device at once
    budget_bytes: int = 0  # this worker's share of INFERQ_MEMORY_BUDGET; 0: none


def model_info(model: Model, model_name: str, settings: Settings, backend: str) -> ModelInfo:
    return ModelInfo(
        inputs=tuple(sorted(str(k) for k in model.inputs)),
        output=str(model.output),
        parameters=dict(model.parameters),
        max_cost=model.max_cost,
        # Optional (`models.base`): only a model trained for truncation declares it.
        matryoshka_dims=tuple(getattr(model, "matryoshka_dims", ()) or ()),
        version=model_version(
            model,
            model_name,
            backend,
            settings.model_path or "",
            settings.onnx_variant,
            settings.dtype,
        ),
    )


def build_worker(
    settings: Settings,
    model: Model,
    model_name: str,
    redis: Redis,
    plan: WorkerPlan,
    *,
    metrics: WorkerMetrics | None = None,
    clock: Clock | None = None,
) -> Worker:
    clock = clock or SystemClock()
    identity = WorkerIdentity(
        consumer=settings.consumer_name(plan.device, model_name),
        model_name=model_name,
        device=plan.device,
        backend=plan.backend,
        calibration=plan.calibration,
        ceiling_reason=plan.ceiling_reason,
    )
    queue = JobConsumer(
        redis,
        result_ttl_s=settings.result_ttl_s,
        shards=settings.stream_shards,
        keep_inputs=settings.keep_inputs,  # FINISH drops a job's inputs unless asked not to
    )
    registry = WorkerRegistry(redis)
    max_cost = model.max_cost or 1
    top = max(plan.ceiling or settings.max_batch_tokens, max_cost)
    scheduler = Scheduler(
        LiveCeiling(top, max_cost, settings.ceiling_recover_after),
        max_batch_size=settings.max_batch_size,
        max_wait_s=settings.max_wait_ms / 1000,
        min_fill=settings.min_padding_efficiency,
        streams=plan.model_threads,
    )
    telemetry = Telemetry(settings, model_name, plan.device, metrics, plan.budget_bytes)
    outbox = Outbox(queue, metrics.background_errors if metrics is not None else None)
    book = Book(model_name, scheduler, outbox, telemetry, clock, worker=identity.consumer)
    intake = Intake(
        queue,
        registry,
        model,
        settings,
        model_name=model_name,
        consumer=identity.consumer,
        clock=clock,
    )
    executor = Executor(model, scheduler, threads=plan.model_threads, device=plan.device)
    heartbeat = Heartbeat(
        registry,
        period_s=settings.heartbeat_s,
        ttl_s=settings.heartbeat_ttl_s,
        stuck_after_s=settings.visibility_timeout_s,
        errors=metrics.background_errors if metrics is not None else None,
    )
    parts = WorkerParts(
        queue=queue,
        registry=registry,
        scheduler=scheduler,
        telemetry=telemetry,
        outbox=outbox,
        book=book,
        intake=intake,
        executor=executor,
        heartbeat=heartbeat,
        info=model_info(model, model_name, settings, plan.backend),
        clock=clock,
    )
    return Worker(settings, identity, parts)
