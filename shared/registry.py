"""The worker registry: heartbeats, live workers, and the refresh of held stream entries.

A worker writes its `WorkerBeat` every `heartbeat_s` to `keys.worker(id)` (a hash of
strings, TTL `heartbeat_ttl_s`) and scores itself in `keys.workers(model)` (a zset scored by
expiry ms). The API reads both for readiness, /v1/health, /v1/models and admission
(throughput); another worker reads the hash's existence to tell a dead consumer from a live
one. The beat also keeps the worker's held entries fresh (XCLAIM JUSTID resets their idle
time without counting a delivery), so no live worker's jobs are taken over, and only those
still in its own pending list (`lua.queue.REFRESH`): a worker that was frozen past its TTL and
resumes must not steal back what another worker took over; it learns they are lost.

`WorkerBeat` is the heartbeat's schema, written and read only here.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from inferq.shared import keys, lua
from inferq.shared.lua import queue as scripts
from inferq.shared.redis_conn import as_str, unavailable


@dataclass(slots=True)
class WorkerBeat:
    """One worker's heartbeat record (every field is stored as a string)."""

    id: str
    host: str
    pid: int
    model: str
    backend: str
    device: str
    token_ceiling: int
    items_per_s: float
    last_batch_size: int
    last_batch_tokens: int
    last_batch_at_ms: int
    batches: int
    ooms: int
    held_items: int
    beat_ms: int
    mem_allocated: int
    mem_reserved: int
    mem_total: int
    calibration: str = ""  # the calibration file's JSON, or ""
    ceiling_reason: str = ""
    mem_footprint: int = 0  # the process's device memory as nvidia-smi shows it (RSS on a CPU)
    mem_budget: int = 0  # its share of INFERQ_MEMORY_BUDGET; 0 without one

    def to_hash(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a served model takes and gives, as its workers declare it at start, so the API
    can refuse an input of the wrong kind or an unknown parameter without a device."""

    inputs: tuple[str, ...]  # input kinds: text, image, tensor
    output: str  # vector, labels, boxes, text, any
    parameters: dict[str, str]  # name → what it does
    max_cost: int | None = None
    version: str = ""  # changes with the weights and code: part of every result-cache key
    # The sizes a vector may be truncated to (`dimensions` on /v1/embeddings), ascending; a
    # model declares them only if it was trained for it (Matryoshka). Empty: it was not.
    matryoshka_dims: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        bad = [d for d in self.matryoshka_dims if isinstance(d, bool) or not isinstance(d, int)]
        if bad or any(d <= 0 for d in self.matryoshka_dims):
            raise ValueError(
                f"matryoshka_dims={self.matryoshka_dims!r}: want positive integers (the "
                "vector sizes the model was trained to be truncated to), or () for none"
            )
        object.__setattr__(self, "matryoshka_dims", tuple(sorted(set(self.matryoshka_dims))))

    def to_hash(self) -> dict[str, str]:
        return {
            "version": self.version,
            "inputs": ",".join(self.inputs),
            "output": self.output,
            "parameters": orjson.dumps(self.parameters).decode(),
            "max_cost": "" if self.max_cost is None else str(self.max_cost),
            "matryoshka_dims": ",".join(str(d) for d in self.matryoshka_dims),
        }

    @classmethod
    def from_hash(cls, raw: Mapping[bytes | str, bytes | str]) -> ModelInfo | None:
        f = {as_str(k): as_str(v) for k, v in raw.items()}
        if "inputs" not in f:
            return None
        try:
            params = orjson.loads(f.get("parameters") or "{}")
        except orjson.JSONDecodeError:
            params = {}
        cost = f.get("max_cost", "")
        return cls(
            inputs=tuple(k for k in f["inputs"].split(",") if k),
            output=f.get("output", "any"),
            parameters=params if isinstance(params, dict) else {},
            max_cost=int(cost) if cost.isdigit() else None,
            version=f.get("version", ""),
            # Absent from records written before it existed: such a model declared none.
            matryoshka_dims=tuple(
                int(d) for d in f.get("matryoshka_dims", "").split(",") if d.isdigit() and int(d)
            ),
        )


_TYPES: dict[str, str] = {f.name: str(f.type) for f in dataclasses.fields(WorkerBeat)}
_RANK = {name: i for i, name in enumerate(_TYPES)}


def _number(v: str, kind: str) -> int | float | str | None:
    if v == "" or v.lower() == "none":
        return None
    try:
        return int(float(v)) if kind == "int" else float(v)
    except ValueError:
        return v  # keep what the worker wrote rather than lose it


def decode_beat(raw: Mapping[bytes | str, bytes | str]) -> dict[str, Any]:
    """A heartbeat hash as JSON-ready values, in `WorkerBeat` field order (others after,
    sorted). Tolerant by design: missing fields are absent, unparsable numbers stay strings,
    a calibration that is not JSON is returned as its string."""
    out: dict[str, Any] = {}
    fields = sorted(
        ((as_str(k), as_str(v)) for k, v in raw.items()),
        key=lambda kv: (_RANK.get(kv[0], len(_RANK)), kv[0]),
    )
    for key, val in fields:
        kind = _TYPES.get(key)
        if kind in ("int", "float"):
            out[key] = _number(val, kind)
        elif key == "calibration":
            try:
                out[key] = orjson.loads(val) if val else None
            except orjson.JSONDecodeError:
                out[key] = val
        else:
            out[key] = val
    return out


class WorkerRegistry:
    """Heartbeat reads and writes over one Redis client (both sides use it)."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._refresh = redis.register_script(lua.source(scripts.REFRESH))

    @unavailable
    async def beat(
        self, beat: WorkerBeat, ttl_ms: int, refresh: Mapping[str, Sequence[str]] | None = None
    ) -> dict[str, list[str]]:
        """Write the beat and score, and keep `refresh` (stream → entry ids held by this
        worker) fresh. Returns the held entries another worker has taken over meanwhile
        (stream → ids): they are that worker's now and were left alone."""
        held = {s: list(ids) for s, ids in (refresh or {}).items() if ids}
        argv: list[str | int] = [keys.GROUP, beat.id]
        for ids in held.values():
            argv += [len(ids), *ids]
        cluster = isinstance(self.redis, RedisCluster)
        async with self.redis.pipeline(transaction=False) as p:
            p.hset(keys.worker(beat.id), mapping=beat.to_hash())  # type: ignore[arg-type]
            p.pexpire(keys.worker(beat.id), ttl_ms)
            p.zadd(keys.workers(beat.model), {beat.id: beat.beat_ms + ttl_ms})
            p.zremrangebyscore(keys.workers(beat.model), "-inf", beat.beat_ms)
            if held and not cluster:
                await self._refresh(keys=list(held), args=argv, client=p)
            replies = await p.execute()
        if not held:
            return {}
        if cluster:  # no scripts in a cluster pipeline, and one slot (shard) per call
            return await self._refresh_by_shard(beat.id, held)
        lost = zip(held, replies[-1], strict=True)
        return {s: [as_str(i) for i in ids] for s, ids in lost if ids}

    async def _refresh_by_shard(
        self, consumer: str, held: dict[str, list[str]]
    ) -> dict[str, list[str]]:
        by_tag: dict[str, dict[str, list[str]]] = {}
        for stream, ids in held.items():
            by_tag.setdefault(stream[: stream.index("}") + 1], {})[stream] = ids

        async def one(part: dict[str, list[str]]) -> dict[str, list[str]]:
            argv: list[str | int] = [keys.GROUP, consumer]
            for ids in part.values():
                argv += [len(ids), *ids]
            reply = await self._refresh(keys=list(part), args=argv)
            return {s: [as_str(i) for i in ids] for s, ids in zip(part, reply, strict=True) if ids}

        lost: dict[str, list[str]] = {}
        for part in await asyncio.gather(*(one(p) for p in by_tag.values())):
            lost |= part
        return lost

    @unavailable
    async def describe(self, model: str, info: ModelInfo) -> None:
        """Declare what `model` takes and gives (every worker of it writes the same)."""
        await self.redis.hset(keys.model_info(model), mapping=info.to_hash())  # type: ignore[arg-type]

    @unavailable
    async def model_info(self, model: str) -> ModelInfo | None:
        return ModelInfo.from_hash(await self.redis.hgetall(keys.model_info(model)))

    @unavailable
    async def unregister(self, worker_id: str, model: str) -> None:
        async with self.redis.pipeline(transaction=False) as p:
            p.delete(keys.worker(worker_id))
            p.zrem(keys.workers(model), worker_id)
            await p.execute()

    @unavailable
    async def live(self, model: str, now_ms: int) -> list[str]:
        """Worker ids of `model` whose beat has not expired."""
        ids: list[bytes] = await self.redis.zrangebyscore(keys.workers(model), now_ms, "+inf")  # type: ignore[assignment]
        return [as_str(i) for i in ids]

    @unavailable
    async def alive(self, worker_ids: Sequence[str]) -> list[bool]:
        """Whether each worker's heartbeat record still exists (it expires with its TTL)."""
        if not worker_ids:
            return []
        async with self.redis.pipeline(transaction=False) as p:
            for wid in worker_ids:
                p.exists(keys.worker(wid))
            return [bool(a) for a in await p.execute()]

    @unavailable
    async def throughput(self, model: str, now_ms: int) -> float:
        """Items/s over the last few seconds, summed over the model's live workers."""
        ids = await self.live(model, now_ms)
        if not ids:
            return 0.0
        async with self.redis.pipeline(transaction=False) as p:
            for i in ids:
                p.hget(keys.worker(i), "items_per_s")
            values = await p.execute()
        return sum(float(v) for v in values if v)

    @unavailable
    async def beats(self, models: Sequence[str], now_ms: int) -> dict[str, list[dict[str, Any]]]:
        """Live workers per model, each as `decode_beat` gives it plus `beat_age_ms`."""
        async with self.redis.pipeline(transaction=False) as p:
            for m in models:
                p.zrangebyscore(keys.workers(m), now_ms, "+inf")
            ids_per_model = [[as_str(i) for i in ids] for ids in await p.execute()]
        flat = [wid for ids in ids_per_model for wid in ids]
        raws: list[Any] = []
        if flat:
            async with self.redis.pipeline(transaction=False) as p:
                for wid in flat:
                    p.hgetall(keys.worker(wid))
                raws = await p.execute()
        by_id = {wid: decode_beat(b or {}) for wid, b in zip(flat, raws, strict=True)}
        out: dict[str, list[dict[str, Any]]] = {}
        for m, ids in zip(models, ids_per_model, strict=True):
            # A member whose hash just expired still counts (its zset score says live).
            out[m] = [by_id[wid] | {"id": by_id[wid].get("id", wid)} for wid in sorted(ids)]
            for w in out[m]:
                beat = w.get("beat_ms")
                w["beat_age_ms"] = now_ms - beat if isinstance(beat, int) else None
        return out
