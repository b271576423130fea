"""Every `INFERQ_*` setting, declared once with its type, default and trade-off.

Built at an entry point (`Settings()` reads the environment) and passed down; nothing
instantiates settings at import time, so tests can hand in their own.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ModelSpec:
    """`INFERQ_MODEL` / `INFERQ_MODELS` entries: `name`, `name=target` or `pkg.mod:Class`.

    The name is what clients send and what keys are built from; the target is what the
    worker loads (a built-in name or `package.module:ClassName`). A bare `pkg.mod:Class`
    is served under its class name lower-cased, so URLs and keys stay clean.
    """

    __slots__ = ("name", "target")

    def __init__(self, spec: str) -> None:
        spec = spec.strip()
        name, sep, target = spec.partition("=")
        if not sep:
            target = spec
            name = spec.rsplit(":", 1)[-1].lower() if ":" in spec else spec
        if not _MODEL_NAME.match(name) or not target:
            raise ValueError(
                f"invalid model spec {spec!r}: want 'name', 'name=target' or 'pkg.mod:Class'"
            )
        self.name, self.target = name, target

    def __repr__(self) -> str:
        return f"ModelSpec({self.name}={self.target})"


class Settings(BaseSettings):
    """inferq configuration; every field maps to `INFERQ_<FIELD>` in the environment."""

    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore", frozen=True)

    # --- shared ---
    redis_url: SecretStr = Field(
        SecretStr("redis://127.0.0.1:6379/0"),
        description="Redis URL (redis://, rediss:// for TLS, unix://). Secret: it may carry a "
        "password. On a Redis Cluster it may name several nodes, redis://h1:p1,h2:p2,h3:p3: "
        "a process starts from whichever answers.",
    )
    model: str = Field(
        "minilm",
        description="The model served when a request names none: 'minilm', 'echo', "
        "'name=pkg.mod:Class'.",
    )
    models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated models this deployment serves; empty means just INFERQ_MODEL.",
    )
    result_ttl_s: int = Field(
        3600,
        gt=0,
        description="How long a finished job's record is kept, unless its request set "
        "`result_ttl_s`.",
    )
    sync_result_ttl_s: int = Field(
        120,
        gt=0,
        description="How long the record of a job answered in its request's own response "
        "(/v1/infer, /v1/embeddings, OIP infer) is kept, unless the request set `result_ttl_s` "
        "or a webhook: the answer was delivered, and an hour of kept outputs at a GPU's rate "
        "fills Redis. Long enough for a retry with the same Idempotency-Key after a lost answer "
        "(the Python client's retries span about a minute). A wait that ends in 202 keeps it "
        "INFERQ_RESULT_TTL_S. Capped at INFERQ_RESULT_TTL_S.",
    )
    result_ttl_max_s: int = Field(
        7 * 86_400,
        gt=0,
        description="The longest `result_ttl_s` a request may set (a longer one is refused, 422).",
    )
    data_dir: Path = Field(
        Path(".inferq"), description="Where `inferq up` keeps its Redis data (AOF) and local state."
    )
    log_level: str = Field(
        "INFO", description="Python logging level: DEBUG adds a line per batch (costs CPU per job)."
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="Log lines as text (for people) or one JSON object each (for collectors).",
    )

    # --- api ---
    max_inputs_per_job: int = Field(256, gt=0, description="More inputs per job → 413.")
    max_input_chars: int = Field(
        20_000,
        gt=0,
        description="Characters one text input may have; a longer one is refused (413).",
    )
    max_body_bytes: int = Field(
        32 * 1024 * 1024,
        gt=0,
        description="Larger request body → 413. Above INFERQ_MAX_IMAGE_BYTES, so one image can "
        "come base64-encoded in JSON (a third larger than its bytes).",
    )
    max_image_bytes: int = Field(
        20 * 1024 * 1024, gt=0, description="A larger single image (its encoded bytes) → 413."
    )
    max_tensor_bytes: int = Field(
        20 * 1024 * 1024, gt=0, description="A larger single tensor input (its raw bytes) → 413."
    )
    max_queue_bytes: int = Field(
        512 * 1024 * 1024,
        gt=0,
        description="Input bytes held in Redis per model (queued and running) before submits get "
        "429: a queue of large images can fill Redis' memory long before INFERQ_MAX_QUEUE items.",
    )
    sync_wait_s: float = Field(
        30.0, ge=0, le=60, description="Default wait of POST /v1/infer and /v1/embeddings."
    )
    max_long_poll_s: float = Field(60.0, gt=0, description="Cap on ?wait= and on the infer wait.")
    long_poll_recheck_s: float = Field(
        2.0,
        gt=0,
        description="A waiting request re-reads its job this often even without a completion "
        "message: the most a lost pub/sub message can delay an answer. Shorter costs one Redis "
        "read per waiter per period.",
    )
    keepalive_s: float = Field(
        75.0,
        gt=0,
        description="How long the API keeps an idle HTTP connection open. Keep it longer than "
        "the idle timeout of every client pool and proxy in front (nginx's upstream "
        "keepalive_timeout, 60 s in deploy/nginx.conf): the side that closes an idle "
        "connection must be the client, or a request sent as the server closes gets a reset.",
    )
    redis_timeout_s: float = Field(
        2.0, gt=0, description="API socket timeout: an unreachable Redis answers 503, never hangs."
    )
    redis_pool_size: int = Field(
        64,
        gt=0,
        description="API Redis connections; past it a request waits up to redis_timeout_s, then 503.",
    )
    redis_multiplex: bool = Field(
        True,
        description="The queue's scripts (submit, claim, start, finish) share one connection per "
        "process, commands of one event-loop turn in one write: a fraction of a pooled call's "
        "client CPU; a worker's reads (they block) take a second one of their own. Used with a "
        "redis:// URL of one server (not Sentinel, Cluster, TLS or a socket); false: every call "
        "takes a pooled connection.",
    )
    redis_sentinels: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated Sentinel 'host:port' list. Set: the master is found through "
        "them (INFERQ_REDIS_SENTINEL_MASTER) and followed across failovers; INFERQ_REDIS_URL then "
        "only supplies the password, database and TLS scheme.",
    )
    redis_sentinel_master: str = Field(
        "mymaster", description="The master's name as the sentinels know it."
    )
    redis_cluster: bool = Field(
        False,
        description="INFERQ_REDIS_URL names one node of a Redis Cluster, or several (seeds: any "
        "one that answers will do): clients follow the slot map and its failovers. Every "
        "script's keys share a hash tag (see docs/architecture.md).",
    )
    stream_shards: int = Field(
        1,
        ge=1,
        le=64,
        description="Streams each model's queue is spread over (each with its own hash tag, so "
        "on a cluster a hot model uses several nodes). The same number on every API and worker.",
    )
    redis_wait_replicas: int = Field(
        0,
        ge=0,
        description="After each accepted submit, WAIT until this many replicas have it (up to "
        "INFERQ_REDIS_TIMEOUT_S, else 503): a failover then cannot lose an acknowledged job. 0 = "
        "async replication (a write acknowledged just before the master dies can be lost).",
    )

    # --- tenants, quotas and Redis memory (docs/operations.md, "Security and limits") ---
    admin_keys: SecretStr | None = Field(
        None,
        description="'name:key,...' or '@/path/file': keys that may read /v1/health, /metrics "
        "and the workers in /v1/models. With INFERQ_API_KEYS set and no admin key, nobody can.",
    )
    tenant_queue_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="The share of INFERQ_MAX_QUEUE and INFERQ_MAX_QUEUE_BYTES one tenant may hold "
        "when INFERQ_API_KEYS names several tenants (429 tenant_queue_full): one tenant cannot "
        "fill the queue for the others. 1 turns the per-tenant cap off.",
    )
    tenant_max_files: int = Field(
        100, gt=0, description="Files one tenant may keep (uploads and batch outputs); 429 past it."
    )
    tenant_max_file_bytes: int = Field(
        1 << 30,
        gt=0,
        description="Bytes of files one tenant may keep in Redis (they live "
        "INFERQ_BATCH_FILE_TTL_S); an upload past it is refused with 429.",
    )
    tenant_max_batches: int = Field(
        16, gt=0, description="Batches one tenant may have running at once; 429 past it."
    )
    tenant_max_webhooks: int = Field(
        10_000,
        gt=0,
        description="Webhook deliveries of one tenant not yet settled (queued or retrying); new "
        "jobs with a webhook get 429 past it, so one dead target cannot grow Redis for ever.",
    )
    max_json_values: int = Field(
        1 << 20,
        gt=0,
        description="Values (numbers, strings, lists) one JSON body may hold; past it 413 before "
        "parsing. Each costs ~30 bytes of API memory and CPU on the event loop: send large "
        "tensors as base64 `data` or multipart.",
    )
    keep_inputs: bool = Field(
        False,
        description="Keep a finished job's inputs in its record for INFERQ_RESULT_TTL_S. Off, "
        "they are dropped when the job ends, so finished jobs hold their outputs only.",
    )
    redis_maxmemory: str = Field(
        "25%",
        description="maxmemory of the Redis `inferq up` starts (noeviction): bytes ('2GiB'; "
        "'2GB' is 2×10⁹) or a share of the machine's memory ('25%'). Deployments set their own "
        "Redis's (compose, k8s).",
    )
    redis_memory_high_water: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of Redis's maxmemory past which the API refuses new work with 503 + "
        "Retry-After, before Redis refuses writes: finishing work still has room.",
    )

    # --- webhooks (delivered by the API processes) ---
    webhook_secret: SecretStr | None = Field(
        None,
        description="HMAC-SHA256 key of X-Inferq-Signature. Unset (and no tenant secret): jobs "
        "with a webhook are refused (422), since an unsigned callback cannot be trusted.",
    )
    webhook_tenant_secrets: SecretStr | None = Field(
        None,
        description="'tenant:secret,...': a tenant's own signing key, used instead of "
        "INFERQ_WEBHOOK_SECRET for its jobs.",
    )
    webhook_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated hosts or CIDRs a webhook may target although they resolve "
        "to a loopback, private, link-local or metadata address (refused by default: SSRF).",
    )
    webhook_max_age_s: float = Field(
        86_400.0,
        gt=0,
        description="A delivery is retried (exponential backoff with jitter) for this long after "
        "its first attempt, then dead-lettered.",
    )
    webhook_timeout_s: float = Field(
        5.0, gt=0, description="Connect + read timeout of one delivery attempt."
    )
    webhook_backoff_s: float = Field(
        1.0, gt=0, description="First retry delay; doubles per attempt (with jitter)."
    )
    webhook_backoff_max_s: float = Field(
        600.0,
        gt=0,
        description="Longest retry delay: caps the doubling, and a Retry-After asking for more.",
    )
    webhook_per_target: int = Field(
        4,
        gt=0,
        description="Attempts in flight to one target (host and port) per API process: a slow "
        "target holds its own slots, never all of INFERQ_WEBHOOK_CONCURRENCY.",
    )
    webhook_breaker_failures: int = Field(
        5,
        gt=0,
        description="Failed attempts in a row after which a target's circuit opens: its deliveries "
        "wait INFERQ_WEBHOOK_BREAKER_COOLDOWN_S without being attempted.",
    )
    webhook_breaker_cooldown_s: float = Field(
        30.0,
        gt=0,
        description="How long an open circuit waits before one attempt tries the target.",
    )
    webhook_concurrency: int = Field(
        16, gt=0, description="Deliveries one API process makes at once."
    )

    # --- batch files (OpenAI Batch API) ---
    max_batch_file_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="Larger uploaded file (POST /v1/files) → 413. Files live in Redis.",
    )
    max_batch_lines: int = Field(50_000, gt=0, description="More requests in one batch file → 422.")
    batch_file_ttl_s: int = Field(
        7 * 86_400, gt=0, description="How long uploaded files, batch records and outputs are kept."
    )
    batch_in_flight: int = Field(
        256,
        gt=0,
        description="Lines of one batch queued at once (in the low lane): more finishes a batch "
        "sooner, fewer leaves more of the queue's admission to interactive traffic.",
    )

    # --- result cache ---
    cache_ttl_s: int = Field(
        0,
        ge=0,
        description="Result cache: a succeeded job's outputs are kept this long under a hash of "
        "model, weights, inputs and parameters, and an identical request is answered without "
        "queueing. 0 = off.",
    )
    cache_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated models whose results are cached; empty = every served model "
        "(when INFERQ_CACHE_TTL_S > 0).",
    )
    cache_shared: bool = Field(
        False, description="Share cached results across tenants (off: each tenant its own)."
    )
    cache_max_bytes: int = Field(
        256 * 1024 * 1024,
        gt=0,
        description="Cached outputs kept at most; past it the entries closest to expiry go first. "
        "Job records are never evicted (noeviction stays on).",
    )

    # --- worker ---
    model_path: str | None = Field(
        None,
        description="Local model directory: a minilm-style encoder, or the Hugging Face causal-LM / "
        "seq2seq directory the 'generate' model serves.",
    )
    device: str = Field("auto", description="'auto' (cuda if present), 'cpu', 'cuda', 'cuda:N'.")
    dtype: Literal["auto", "float32", "float16"] = Field(
        "auto",
        description="Weights and activations of the built-in minilm on torch. auto: float16 on "
        "CUDA (half the memory and launch-bound kernels' time; its vectors match float32's to a "
        "cosine of at least 0.9999 on the bench corpora, tested), float32 on a CPU.",
    )
    max_batch_tokens: int = Field(
        8192,
        gt=0,
        description="Padded tokens per batch (items × longest). The memory bound: raise it until "
        "the device is compute-bound, keep it below what fits in memory.",
    )
    max_batch_size: int = Field(
        32,
        gt=0,
        description="Most items per batch, whatever their cost: larger batches, more latency.",
    )
    max_wait_ms: float = Field(
        0.0,
        ge=0,
        description="How long the first pending item may wait for others when the device is idle. "
        "0: run at once; under load batches still fill with what arrives while the device is busy. "
        "Raise it (a few ms) when one big batch costs about what one item does (GPUs) and load is moderate.",
    )
    min_padding_efficiency: float = Field(
        0.85,
        ge=0,
        le=1,
        description="Least real ÷ padded tokens a multi-item batch may have. Higher wastes less "
        "compute on padding but runs more, smaller batches on mixed lengths; 0 packs by bounds only.",
    )
    model_threads: int = Field(
        0,
        ge=0,
        description="Batches run at once, each in its own model thread. 0 = auto: on a CPU, for "
        "a built-in model that runs without holding the GIL (traced on torch, or on ONNX), one per "
        "core up to 4; otherwise 1.",
    )
    intra_op_threads: int = Field(
        0,
        ge=0,
        description="Threads per batch (torch / ONNX Runtime). 0 = auto: cores ÷ model_threads on CPU.",
    )
    prefetch_items: int = Field(
        0,
        ge=0,
        description="Items a worker holds, running batches included (0 = 2 × max_batch_size). "
        "More fills batches better; less leaves work for other workers.",
    )
    read_block_ms: int = Field(
        1000,
        gt=0,
        description="An idle worker's XREADGROUP BLOCK: how often it wakes with nothing read.",
    )
    worker_id: str = Field(
        "",
        description="Stable consumer name, so a restart finds its own pending jobs; default host:device:model.",
    )
    heartbeat_s: float = Field(
        1.0,
        gt=0,
        description="How often a worker writes its heartbeat (and keeps its entries fresh).",
    )
    heartbeat_ttl_s: float = Field(
        5.0, gt=0, description="A worker is dead this long after its last beat."
    )
    backend: Literal["auto", "torch", "onnx"] = Field(
        "auto",
        description="Runtime of the built-in models (minilm, efficientnet-lite0): torch or "
        "ONNX Runtime. auto: the fastest measured for the device: ONNX Runtime fp32 for minilm "
        "on a CPU (about 2× torch one item at a time, cosine 1.0000), torch otherwise.",
    )
    torchscript: bool = Field(
        True,
        description="Built-in models on torch: trace the net with TorchScript at load, so a batch "
        "runs without holding the GIL (checked against eager at load; eager if they differ).",
    )
    onnx_variant: Literal["fp32", "int8"] = Field(
        "fp32",
        description="ONNX weights: fp32, or int8 dynamic quantization (faster on CPU, ~0.3% quality).",
    )
    memory_budget: str | None = Field(
        None,
        description="Device memory the workers on one device may use, as nvidia-smi counts it (CUDA "
        "context, weights, the allocator's reserve): bytes ('6GiB', '512MiB') or a fraction of the "
        "device ('0.8'), split between INFERQ_WORKERS_PER_DEVICE workers. Turned into the token "
        "ceiling by the calibration, and on CUDA the allocator's cap; INFERQ_MAX_BATCH_TOKENS, "
        "when set explicitly, overrides the ceiling.",
    )
    workers_per_device: int = Field(
        1,
        ge=1,
        description="Worker processes sharing this worker's device (`inferq up --workers N` sets "
        "it): each gets INFERQ_MEMORY_BUDGET ÷ N, and on CUDA its allocator is capped there. More "
        "workers keep a GPU busier when one process's Python is the limit.",
    )
    snapshot_at: float | None = Field(
        None,
        gt=0,
        le=1,
        description="CUDA only: dump a memory snapshot when usage passes this fraction.",
    )
    snapshot_cooldown_s: float = Field(
        300.0, gt=0, description="At most one snapshot per cooldown."
    )
    ceiling_recover_after: int = Field(
        50, gt=0, description="Successful batches before a lowered live ceiling is raised one step."
    )
    worker_metrics_port: int = Field(0, ge=0, description="Worker Prometheus port; 0 = off.")
    visibility_timeout_s: float = Field(
        30.0,
        gt=0,
        description="An entry idle this long is taken over from whoever holds it, even a live worker: "
        "live workers keep their entries fresh only while their device makes progress, so this "
        "bounds how long a hung worker (or an unnoticed crash) delays a job.",
    )
    drain_s: float = Field(
        30.0,
        gt=0,
        description="On SIGTERM a worker stops reading, finishes the batches on the device, hands "
        "back everything else and posts its results within this; past it, it hands back what is "
        "left and exits non-zero. Keep it below the orchestrator's grace period.",
    )
    max_deliveries: int = Field(
        3,
        gt=0,
        description="Device starts that never finished (the job was on the device when its worker "
        "died) before the job is dead-lettered as poisoned.",
    )
    job_timeout_s: float = Field(
        300.0, gt=0, description="Default deadline of a job (body: timeout_s)."
    )
    max_queue: int = Field(
        10_000,
        gt=0,
        description="Items queued or held by workers, per model, before submits get 429: "
        "bounds latency.",
    )
    api_keys: SecretStr | None = Field(
        None, description="'tenant:key,...' or '@/path/file' (one pair per line). Unset = open API."
    )
    idempotency_ttl_s: int = Field(
        86_400, gt=0, description="How long an Idempotency-Key is remembered."
    )
    max_new_tokens: int = Field(
        256,
        gt=0,
        description="generate model: the most tokens a request may ask for (parameters."
        "max_new_tokens, default 32); the KV cache, and so the batch cost, grows with it.",
    )
    echo_batch_delay_ms: float = Field(
        0.0, ge=0, description="echo model: a sleep per batch, to stand in for a slow device."
    )
    echo_token_delay_ms: float = Field(0.0, ge=0, description="echo model: sleep per padded token.")

    @field_validator("models", "redis_sentinels", "webhook_allow", "cache_models", mode="before")
    @classmethod
    def _split_models(cls, v: object) -> object:
        if isinstance(v, str):
            return [m.strip() for m in v.split(",") if m.strip()]
        return v

    @field_validator("api_keys", "admin_keys")
    @classmethod
    def _no_weak_keys(cls, v: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if v is not None:
            check_keys(v.get_secret_value(), f"INFERQ_{str(info.field_name).upper()}")
        return v

    @field_validator("redis_url")
    @classmethod
    def _no_placeholder_password(cls, v: SecretStr) -> SecretStr:
        password = urlsplit(v.get_secret_value()).password
        if password and (word := placeholder_word(password)):
            raise ValueError(
                f"INFERQ_REDIS_URL carries a placeholder password (it contains {word!r}): "
                "set the real one"
            )
        return v

    @model_validator(mode="after")
    def _check(self) -> Settings:
        for spec in [self.model, *self.models]:
            ModelSpec(spec)  # raises ValueError naming the bad spec
        if self.redis_cluster and self.redis_sentinels:
            raise ValueError(
                "INFERQ_REDIS_CLUSTER and INFERQ_REDIS_SENTINELS exclude each other: a cluster "
                "fails over by itself"
            )
        netloc = self.redis_url.get_secret_value().split("://", 1)[-1].split("/", 1)[0]
        if "," in netloc.rpartition("@")[2] and not self.redis_cluster:
            raise ValueError(
                "INFERQ_REDIS_URL names several nodes: that is a Redis Cluster's seed list, "
                "set INFERQ_REDIS_CLUSTER=true (Sentinel takes INFERQ_REDIS_SENTINELS)"
            )
        if self.read_block_ms / 1000 >= self.heartbeat_ttl_s:
            raise ValueError(
                "read_block_ms must stay below heartbeat_ttl_s, or a idle worker looks dead"
            )
        return self

    # --- derived ---
    @property
    def default_model(self) -> ModelSpec:
        return ModelSpec(self.model)

    @property
    def served_models(self) -> dict[str, ModelSpec]:
        """Declared models by name; the default is always among them."""
        specs = [ModelSpec(s) for s in self.models] or [self.default_model]
        out = {s.name: s for s in specs}
        out.setdefault(self.default_model.name, self.default_model)
        return out

    @property
    def prefetch_limit(self) -> int:
        return self.prefetch_items or 2 * self.max_batch_size

    def consumer_name(self, device: str, model: str) -> str:
        return self.worker_id or f"{socket.gethostname()}:{device}:{model}"


# --- keys and passwords a deployment must not ship with (INFERQ_API_KEYS, INFERQ_ADMIN_KEYS,
# INFERQ_REDIS_URL's password): refused at start, naming the setting, never the value ---

#: Shorter keys are guessable; `openssl rand -hex 24` makes a 48-character one.
MIN_KEY_CHARS = 16
#: Words that mark a value someone was meant to replace, compared without case or
#: punctuation ('Change-Me' is 'changeme'); six letters or more, so a random key never
#: holds one by chance.
PLACEHOLDERS = ("changeme", "replaceme", "placeholder", "example", "secret", "password")


def placeholder_word(value: str) -> str | None:
    """The placeholder word `value` contains, or None."""
    folded = re.sub(r"[^a-z0-9]", "", value.lower())
    return next((w for w in PLACEHOLDERS if w in folded), None)


def check_keys(raw: str, setting: str) -> None:
    """Raise ValueError when an inline 'name:key,...' list holds no pair, or a key shorter
    than MIN_KEY_CHARS or holding a placeholder word. The '@/path' form is read, and its
    pairs parsed, by the API at start (`inferq.api.core.auth`)."""
    raw = raw.strip()
    if raw.startswith("@"):
        return
    pairs = [p.strip() for p in raw.replace("\n", ",").split(",")]
    pairs = [p for p in pairs if p and not p.startswith("#")]
    if not pairs:
        raise ValueError(f"{setting} is set but holds no 'name:key' pair")
    for n, pair in enumerate(pairs):
        name, _, key = (part.strip() for part in pair.partition(":"))
        who = f"{setting} entry {n} ({name!r})"
        if word := placeholder_word(key):
            raise ValueError(
                f"{who}: the key is a placeholder (it contains {word!r}); set a real one"
            )
        if key and len(key) < MIN_KEY_CHARS:
            raise ValueError(
                f"{who}: the key has {len(key)} characters, fewer than {MIN_KEY_CHARS} "
                "(`openssl rand -hex 24` makes one)"
            )
