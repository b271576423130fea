"""Every Prometheus metric inferq exports, declared once, `inferq_` prefix, units in names.

Each side owns a registry of its own, so the API and a worker never collide and tests
build fresh ones:

| metric                               | type      | labels         | side   |
|--------------------------------------|-----------|----------------|--------|
| `inferq_jobs_submitted_total`        | counter   | model          | api    |
| `inferq_jobs_rejected_total`         | counter   | model, reason  | api    |
| `inferq_queue_depth`                 | gauge     | model          | api    |
| `inferq_requests_waiting`            | gauge     | –              | api    |
| `inferq_webhook_deliveries_total`    | counter   | outcome        | api    |
| `inferq_webhook_attempt_seconds`     | histogram | –              | api    |
| `inferq_batches_finished_total`      | counter   | status         | api    |
| `inferq_batch_lines_total`           | counter   | result         | api    |
| `inferq_redis_memory_ratio`          | gauge     | –              | api    |
| `inferq_background_errors_total`     | counter   | loop           | both   |
| `inferq_webhook_deferrals_total`     | counter   | why            | api    |
| `inferq_jobs_finished_total`         | counter   | model, status  | worker |
| `inferq_job_queue_seconds`           | histogram | model          | worker |
| `inferq_job_latency_seconds`         | histogram | model          | worker |
| `inferq_batch_size`                  | histogram | model          | worker |
| `inferq_batch_tokens`                | histogram | model          | worker |
| `inferq_batch_seconds`               | histogram | –              | worker |
| `inferq_oom_total`                   | counter   | –              | worker |
| `inferq_batch_splits_total`          | counter   | –              | worker |
| `inferq_token_ceiling`               | gauge     | –              | worker |
| `inferq_device_memory_bytes`         | gauge     | kind           | worker |

Counters are declared without the `_total` suffix (prometheus-client appends it), so the
exposed names are exactly the ones above. `inferq_background_errors_total{loop}` is on both
sides: every background loop's failures, counted by its `inferq.shared.supervise.Supervisor`.
`inferq_device_memory_bytes{kind}` takes `allocated`, `reserved`, `total`, `footprint` (the
process's own, as nvidia-smi shows it) or `budget` (its share of INFERQ_MEMORY_BUDGET; 0
without one) (`MEMORY_KINDS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "BATCH_TOKENS_BUCKETS",
    "CONTENT_TYPE_LATEST",
    "MEMORY_KINDS",
    "SECONDS_BUCKETS",
    "ApiMetrics",
    "WorkerMetrics",
    "api_metrics",
    "render",
    "worker_metrics",
]

# The `*_created` companion series double every counter/histogram for a timestamp nobody
# graphs; inferq's scrapes stay at the families listed above. (Process-wide switch.)
disable_created_metrics()

PREFIX = "inferq"
MEMORY_KINDS = ("allocated", "reserved", "total", "footprint", "budget")

# Items per batch: powers of two up to 512 (max_batch_size rarely goes beyond).
BATCH_SIZE_BUCKETS = tuple(float(2**i) for i in range(10))  # 1 .. 512
# Padded tokens per batch: powers of two from 16 up to 65536.
BATCH_TOKENS_BUCKETS = tuple(float(2**i) for i in range(4, 17))  # 16 .. 65536
# Durations: 1 ms .. 60 s, roughly 1-2.5-5 per decade.
SECONDS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


@dataclass(frozen=True)
class ApiMetrics:
    """The API process's metrics on their own registry.

    `queue_depth` is set from Redis (XLEN per served model) and `requests_waiting` from the
    process's notifier right before each scrape.
    """

    registry: CollectorRegistry
    jobs_submitted: Counter
    jobs_rejected: Counter
    queue_depth: Gauge
    requests_waiting: Gauge
    cache_lookups: Counter
    webhook_deliveries: Counter
    webhook_attempt_seconds: Histogram
    batches_finished: Counter
    batch_lines: Counter
    redis_memory_ratio: Gauge
    background_errors: Counter
    webhook_deferrals: Counter


@dataclass(frozen=True)
class WorkerMetrics:
    """One worker process's metrics on their own registry."""

    registry: CollectorRegistry
    jobs_finished: Counter
    job_queue_seconds: Histogram
    job_latency_seconds: Histogram
    batch_size: Histogram
    batch_tokens: Histogram
    batch_seconds: Histogram
    oom: Counter
    batch_splits: Counter
    token_ceiling: Gauge
    device_memory_bytes: Gauge
    background_errors: Counter

    def memory_series(self) -> tuple[Gauge, ...]:
        """The `inferq_device_memory_bytes{kind}` series, in `MEMORY_KINDS` order."""
        return tuple(self.device_memory_bytes.labels(kind=kind) for kind in MEMORY_KINDS)

    def set_device_memory(
        self, allocated: float, reserved: float, total: float, footprint: float, budget: float
    ) -> None:
        """Set every `inferq_device_memory_bytes{kind}` series at once."""
        values = (allocated, reserved, total, footprint, budget)
        for series, value in zip(self.memory_series(), values, strict=True):
            series.set(value)


def api_metrics(registry: CollectorRegistry | None = None) -> ApiMetrics:
    """Fresh API metrics, on `registry` or a new one (never the global default)."""
    reg = registry if registry is not None else CollectorRegistry(auto_describe=True)
    return ApiMetrics(
        registry=reg,
        jobs_submitted=Counter(
            f"{PREFIX}_jobs_submitted",
            "Jobs accepted and enqueued by the API.",
            ["model"],
            registry=reg,
        ),
        jobs_rejected=Counter(
            f"{PREFIX}_jobs_rejected",
            "Submissions refused by the API, by reason (e.g. queue_full, too_large, invalid).",
            ["model", "reason"],
            registry=reg,
        ),
        queue_depth=Gauge(
            f"{PREFIX}_queue_depth",
            "Entries in the model's job stream (XLEN), read at scrape time.",
            ["model"],
            registry=reg,
        ),
        requests_waiting=Gauge(
            f"{PREFIX}_requests_waiting",
            "Long-polls and /v1/infer calls of this API process waiting for a result.",
            registry=reg,
        ),
        cache_lookups=Counter(
            f"{PREFIX}_cache_lookups",
            "Result-cache lookups by result (hit: answered without queueing; miss: queued).",
            ["model", "result"],
            registry=reg,
        ),
        webhook_deliveries=Counter(
            f"{PREFIX}_webhook_deliveries",
            "Webhook attempts by outcome: delivered (2xx), retried (scheduled again), dead "
            "(given up: refused, or past INFERQ_WEBHOOK_MAX_AGE_S).",
            ["outcome"],
            registry=reg,
        ),
        webhook_attempt_seconds=Histogram(
            f"{PREFIX}_webhook_attempt_seconds",
            "One webhook attempt: name resolution and POST, until the receiver's status line.",
            buckets=SECONDS_BUCKETS,
            registry=reg,
        ),
        batches_finished=Counter(
            f"{PREFIX}_batches_finished",
            "Batch API batches (POST /v1/batches) that ended, by final status: completed, "
            "failed, expired, cancelled.",
            ["status"],
            registry=reg,
        ),
        batch_lines=Counter(
            f"{PREFIX}_batch_lines",
            "Batch API request lines recorded, by result: succeeded (output file) or failed "
            "(error file: refused, failed, malformed, or not run).",
            ["result"],
            registry=reg,
        ),
        redis_memory_ratio=Gauge(
            f"{PREFIX}_redis_memory_ratio",
            "Redis used_memory / maxmemory as this API process last read it (0 without a "
            "maxmemory); new work is refused past INFERQ_REDIS_MEMORY_HIGH_WATER.",
            registry=reg,
        ),
        background_errors=Counter(
            f"{PREFIX}_background_errors",
            "Failures a background loop of the API survived (it backs off and goes on), by "
            "loop: batch_leases, batch_run, webhooks_read, webhooks_upkeep, notifier.",
            ["loop"],
            registry=reg,
        ),
        webhook_deferrals=Counter(
            f"{PREFIX}_webhook_deferrals",
            "Webhook deliveries put back unattempted, their target being at its limit "
            "(busy), its circuit open (open) or a probe under way (probing).",
            ["why"],
            registry=reg,
        ),
    )


def worker_metrics(registry: CollectorRegistry | None = None) -> WorkerMetrics:
    """Fresh worker metrics, on `registry` or a new one (never the global default)."""
    reg = registry if registry is not None else CollectorRegistry(auto_describe=True)
    return WorkerMetrics(
        registry=reg,
        jobs_finished=Counter(
            f"{PREFIX}_jobs_finished",
            "Jobs that reached a final state, by status (succeeded, failed, ...).",
            ["model", "status"],
            registry=reg,
        ),
        job_queue_seconds=Histogram(
            f"{PREFIX}_job_queue_seconds",
            "Job created → taken by a worker.",
            ["model"],
            buckets=SECONDS_BUCKETS,
            registry=reg,
        ),
        job_latency_seconds=Histogram(
            f"{PREFIX}_job_latency_seconds",
            "Job created → final.",
            ["model"],
            buckets=SECONDS_BUCKETS,
            registry=reg,
        ),
        batch_size=Histogram(
            f"{PREFIX}_batch_size",
            "Items per batch run on the device.",
            ["model"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=reg,
        ),
        batch_tokens=Histogram(
            f"{PREFIX}_batch_tokens",
            "Padded tokens per batch (items × longest item).",
            ["model"],
            buckets=BATCH_TOKENS_BUCKETS,
            registry=reg,
        ),
        batch_seconds=Histogram(
            f"{PREFIX}_batch_seconds",
            "Model time per batch.",
            buckets=SECONDS_BUCKETS,
            registry=reg,
        ),
        oom=Counter(
            f"{PREFIX}_oom",
            "Device out-of-memory errors caught while running a batch.",
            registry=reg,
        ),
        batch_splits=Counter(
            f"{PREFIX}_batch_splits",
            "Batches split in two after a failure (OOM or a bad item).",
            registry=reg,
        ),
        token_ceiling=Gauge(
            f"{PREFIX}_token_ceiling",
            "Live padded-token ceiling per batch (lowered after an OOM, raised back slowly).",
            registry=reg,
        ),
        device_memory_bytes=Gauge(
            f"{PREFIX}_device_memory_bytes",
            "Device memory by kind: allocated, reserved (by the caching allocator), total, "
            "footprint (the process's, as nvidia-smi shows it), budget (its share).",
            ["kind"],
            registry=reg,
        ),
        background_errors=Counter(
            f"{PREFIX}_background_errors",
            "Failures of a worker task, by loop: consume, schedule, publish, heartbeat. Redis "
            "being away is ridden out with backoff; anything else stops the worker.",
            ["loop"],
            registry=reg,
        ),
    )


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus text format (serve with `CONTENT_TYPE_LATEST`)."""
    return generate_latest(registry)
