"""The API's side of the queue: admit and enqueue a job, record a cached answer, read a job,
end one that never ran, ask a worker to stop one, the reads that describe a model's queue
(depth, position, lanes, a tenant's holdings) for admission, health and ETAs; and hear each
job's completion (`Notifier`, below).

`ScriptBatch`: under load the API's request tasks reach their submit in the same turn of the
event loop (uvicorn starts one task per request that a socket read completed); one pipeline
of their EVALSHAs pays redis-py's checkout, a write and a read once, not once a call. A lone
call yields once (the others of its turn join it) and goes out as before. A write that must
be on replicas goes out with its WAIT in one pipeline, which is one connection: WAIT counts
what *its connection* wrote, and a pipeline retried after a drop runs whole on the new one
(maybe another node, after a failover). A cluster client refuses scripts in its pipelines,
so there the three commands go out together on one connection of the slot's node.

`Notifier`: one pub/sub subscriber per API process, hearing only its own waits: a job's
record names the processes to tell (`listeners`: the submitter's, and each process that
reads it to wait, `JobProducer.get(listen=True)`), so N API processes do not each decode
every completion. Pub/sub is at-most-once (a message published while it reconnects is
gone), so a waiter registers first, then reads the job record, re-reads on a timer, and every
waiter is woken to re-read after each (re)subscribe: a missed message can delay, never lose,
a result. A message usually carries what FINISH wrote (and the worker's progress fields):
the waiter lays it over the job as it last read or created it (`jobs.published_job`), no
read back. The last `RECENT` completions are remembered, so a caller
that has just submitted can skip the first read. The subscription is a supervised loop
(`inferq.shared.supervise`, SURVIVE, loop `notifier`): a drop is counted, logged once per
outage, resubscribed with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
from prometheus_client import Counter
from redis.asyncio import Redis
from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError

from inferq.shared import keys, lua
from inferq.shared.errors import QueueUnavailable
from inferq.shared.jobs import Job, decode_job, encode_submit, inputs_bytes
from inferq.shared.lua import queue as scripts
from inferq.shared.queue import Final, Idempotency, QueueClient, Submitted, shard_of
from inferq.shared.redis_conn import MuxScript, as_str, register, unavailable
from inferq.shared.schema import JobField
from inferq.shared.supervise import SURVIVE, Supervisor

_NO_KEY = Idempotency("")  # a submit without an Idempotency-Key: built once, not per call
# WAIT's answers on a node that is, or just became, a replica.
_DEMOTED = ("WAIT cannot be used with replica", "UNBLOCKED")

_Call = tuple[Sequence[str], Sequence[bytes | str | int], "asyncio.Future[Any]"]


class ScriptBatch:
    """`await batch(keys, args)`: `script(keys=keys, args=args)`, sent in one pipeline with
    the calls of the same turn. Each call gets its own reply or error; a failure of the
    connection fails the calls that rode on it (each is retry-safe, as a lone call is)."""

    def __init__(self, redis: Redis, script: AsyncScript | MuxScript) -> None:
        self.script = script
        self._redis = redis
        # A cluster client refuses scripts in its pipelines; a mux sends a turn's in one write.
        self._solo = isinstance(redis, RedisCluster) or isinstance(script, MuxScript)
        self._joining: list[_Call] | None = None
        self._sending: set[asyncio.Task[None]] = set()  # a task is only weakly held by asyncio

    async def __call__(self, keys: Sequence[str], args: Sequence[bytes | str | int]) -> Any:
        if self._solo:
            return await self.script(keys=keys, args=args)
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self._joining is not None:
            self._joining.append((keys, args, done))
            return await done
        self._joining = joined = [(keys, args, done)]
        try:
            await asyncio.sleep(0)
        finally:
            self._joining = None
            if len(joined) > 1:
                # In a task of its own: the others' answers must not depend on this request
                # staying alive (a cancelled caller cancels only its own future).
                task = asyncio.create_task(self._send(joined))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)
        if len(joined) == 1:
            return await self.script(keys=keys, args=args)
        return await done

    async def _send(self, calls: list[_Call]) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as p:
                for keys, args, _ in calls:
                    p.evalsha(self.script.sha, len(keys), *keys, *args)
                replies = await p.execute(raise_on_error=False)
        except asyncio.CancelledError:  # the loop is shutting down
            for *_, done in calls:
                done.cancel()
            raise
        except Exception as e:  # every call rode on this connection
            replies = [e] * len(calls)
        for call, reply in zip(calls, replies, strict=True):
            await self._answer(call, reply)

    async def _answer(self, call: _Call, reply: Any) -> None:
        keys, args, done = call
        if isinstance(reply, NoScriptError):  # a restarted Redis: the script loads it
            try:
                reply = await self.script(keys=keys, args=args)
            except Exception as e:
                reply = e
        if done.done():  # its caller was cancelled
            return
        if isinstance(reply, BaseException):
            done.set_exception(reply)
        else:
            done.set_result(reply)


async def call_and_wait(
    redis: Redis,
    batch: ScriptBatch,
    keys: Sequence[str],
    args: Sequence[bytes | str | int],
    wait: tuple[int, int],
    renew: tuple[str, int] | None = None,
) -> tuple[Any, int | None]:
    """(the script's reply, how many replicas hold its writes): `wait` = (replicas to wait
    for, timeout ms), as WAIT takes them; no replicas to wait for: just the call, and None.

    `renew` = (key, ttl_s): set that key's TTL before the WAIT. A repeat's script wrote nothing,
    so the WAIT would not cover what it found (whose first write may have been refused for want
    of replicas); renewing its key is a write that does, on any node (missing key: a no-op).
    """
    if wait[0] <= 0:
        return await batch(keys, args), None
    script = batch.script
    if isinstance(redis, RedisCluster):
        return await _on_node(redis, script, keys, args, wait, renew)
    async with redis.pipeline(transaction=False) as p:
        await script(keys=keys, args=args, client=p)
        if renew is not None:
            p.expire(*renew)
        p.wait(*wait)
        try:
            replies = await p.execute()
        except ResponseError as e:
            # The node became a replica under this connection, or the retry reached a new
            # master that has not loaded the script yet (the next pipeline loads it).
            if isinstance(e, NoScriptError) or any(d in str(e) for d in _DEMOTED):
                raise QueueUnavailable(f"redis failing over: {e}") from e
            raise
    return replies[0], int(replies[-1])


async def _on_node(
    redis: RedisCluster,
    script: AsyncScript | MuxScript,
    keys: Sequence[str],
    args: Sequence[bytes | str | int],
    wait: tuple[int, int],
    renew: tuple[str, int] | None,
) -> tuple[Any, int | None]:
    """`call_and_wait` on a cluster: EVALSHA, EXPIRE, WAIT as one pipeline to the slot's
    master. Any failure is the failover's: 503; a retry (same key) lands where the slot is."""
    node = redis.get_node_from_key(keys[0])
    if node is None:
        raise QueueUnavailable(f"no cluster node serves {keys[0]!r}")
    for attempt in range(2):
        commands = [PipelineCommand(0, "EVALSHA", script.sha, len(keys), *keys, *args)]
        if renew is not None:
            commands.append(PipelineCommand(1, "EXPIRE", *renew))
        commands.append(PipelineCommand(len(commands), "WAIT", *wait))
        try:
            await node.execute_pipeline(commands)
        except (ConnectionError, TimeoutError, OSError, RedisError) as e:
            await _reload(redis)
            raise QueueUnavailable(f"redis failing over: {type(e).__name__}: {e}") from e
        results = [c.result for c in commands]
        if attempt == 0 and isinstance(results[0], NoScriptError):
            await redis.script_load(script.script)  # to every master; then once more
            continue
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            # A moved slot or a node that stopped being master: reload the map for the retry.
            await _reload(redis)
            raise QueueUnavailable(f"redis failing over: {errors[0]}")
        return results[0], int(results[-1])  # type: ignore[arg-type]
    raise QueueUnavailable("the script could not be loaded on its node")


async def _reload(redis: RedisCluster) -> None:
    """Re-read the slot map (best effort: while no node answers, the next call tries again)."""
    with contextlib.suppress(RedisError, RedisClusterException, OSError):
        await redis.nodes_manager.initialize()


class JobProducer(QueueClient):
    """What the API process does with the queue."""

    def __init__(
        self,
        redis: Redis,
        *,
        result_ttl_s: int,
        shards: int = 1,
        keep_inputs: bool = False,
        brief_ttl_s: int = 0,  # INFERQ_SYNC_RESULT_TTL_S: such jobs get an index of their own
        listener: str = "",  # this process's `Notifier.listener`: told of its jobs' ends
    ) -> None:
        super().__init__(redis, result_ttl_s=result_ttl_s, shards=shards, keep_inputs=keep_inputs)
        self.brief_ttl_s = brief_ttl_s if brief_ttl_s < result_ttl_s else 0
        self.listener = listener
        self._listener_field = [JobField.LISTENERS, msgpack.packb(listener)] if listener else []
        self._listen = register(redis, lua.source(scripts.LISTEN))
        self._submit = ScriptBatch(redis, register(redis, lua.source(scripts.SUBMIT)))
        self._request_cancel = register(redis, lua.source(scripts.REQUEST_CANCEL))
        self._cached = register(redis, lua.source(scripts.CACHED))
        self._keep = register(redis, lua.source(scripts.KEEP))

    @unavailable
    async def submit(
        self,
        job: Job,
        *,
        max_queue: int = 2**62,
        max_bytes: int = 2**62,
        idempotency: Idempotency | None = None,
        wait: tuple[int, int] = (0, 0),  # (replicas, timeout ms) to WAIT for: call_and_wait, below
        tenant_caps: tuple[int, int] = (0, 0),  # (items, bytes) the tenant may hold; 0: uncounted
    ) -> Submitted:
        """Admit, record and enqueue atomically (retry-safe: keyed by job id / idempotency key).
        `depth` of a refusal: what its cap counts (the shard's, or the tenant's on it)."""
        size = inputs_bytes(job.inputs)
        argv: list[bytes | str | int] = [job.id, len(job.inputs), max_queue]
        idem = idempotency or _NO_KEY
        argv += [idem.ttl_s, size, max_bytes, *tenant_caps, idem.fingerprint, job.created_ms]
        for k, v in encode_submit(job).items():
            argv += [k, v]
        argv += self._listener_field
        shard = shard_of(job.id)
        script_keys = [
            keys.job(job.id),
            keys.stream(job.model, job.priority, shard, self.shards),
            keys.queued_items(job.model, shard, self.shards),
            keys.queued_bytes(job.model, shard, self.shards),
            keys.tenant_items(job.model, shard, self.shards, job.tenant),
            keys.tenant_bytes(job.model, shard, self.shards, job.tenant),
            self._index(job, shard),
        ]
        if idempotency is not None:
            script_keys.append(
                keys.idempotency(job.tenant, idempotency.key_hash, job.model, shard, self.shards)
            )
        renew = (script_keys[-1], idem.ttl_s) if idempotency is not None else None
        (outcome, value), acked = await call_and_wait(
            self.redis, self._submit, script_keys, argv, wait, renew
        )
        outcome, value = as_str(outcome), as_str(value)
        if outcome == "ok":
            job.entry = value
            return Submitted("created", job.id, value, replicas=acked)
        if outcome in ("dup", "conflict"):  # conflict: the key's job is another request's
            return Submitted("duplicate" if outcome == "dup" else outcome, value, replicas=acked)
        return Submitted(outcome, depth=int(value))  # full, full_bytes, tenant_full, tenant_bytes

    @unavailable
    async def record_cached(
        self,
        job: Job,
        fields: dict[str, bytes],
        *,
        idempotency: Idempotency | None = None,
    ) -> Submitted:
        """Record a job that is final at birth (answered from the result cache): never queued,
        never counted against admission; idempotency and webhooks as for any job."""
        ttl = job.result_ttl_s or self.result_ttl_s
        idem = idempotency or _NO_KEY
        argv: list[bytes | str | int] = [job.id, ttl, idem.ttl_s, idem.fingerprint, job.created_ms]
        for k, v in fields.items():
            if k != JobField.INPUTS or self.keep_inputs:
                argv += [k, v]
        shard = shard_of(job.id)
        script_keys = [
            keys.job(job.id),
            keys.webhooks(job.model, shard, self.shards),
            keys.tenant_webhooks(job.model, shard, self.shards, job.tenant),
            self._index(job, shard),
        ]
        if idempotency is not None:
            script_keys.append(
                keys.idempotency(job.tenant, idempotency.key_hash, job.model, shard, self.shards)
            )
        outcome, value = await self._cached(keys=script_keys, args=argv)
        if as_str(outcome) in ("dup", "conflict"):
            return Submitted("duplicate" if as_str(outcome) == "dup" else "conflict", as_str(value))
        return Submitted("created", job.id)

    @unavailable
    async def get(self, job_id: str, *, listen: bool = False) -> Job | None:
        """The job's record; `listen`: if it is not final, this process is told when it ends
        (scripts.LISTEN, whose read is the one returned; a final one is never read in Lua)."""
        raw = await self.redis.hgetall(keys.job(job_id))
        job = decode_job(raw) if raw else None
        if listen and self.listener and job is not None and not job.status.is_final:
            flat = await self._listen(keys=[keys.job(job_id)], args=[self.listener])
            job = decode_job(dict(zip(flat[::2], flat[1::2], strict=True))) if flat else None
        return job

    @unavailable
    async def cancel(self, job: Job, fields: dict[str, bytes], *, only_if_queued: bool) -> int:
        """Finalise a job from outside a worker (cancel/expire); same guard as `finish`."""
        final = Final(job.model, "", "", job.id, fields, tenant=job.tenant)
        script_keys, argv = self._finish_args(job.model, shard_of(job.id), [final], only_if_queued)
        return int((await self._finish(keys=script_keys, args=argv))[0])

    @unavailable
    async def request_cancel(self, job_id: str) -> str:
        """Ask the worker running `job_id` to end it (scripts.REQUEST_CANCEL); its status as
        this call found it ('' if gone): only a `running` job is marked."""
        return as_str(await self._request_cancel(keys=[keys.job(job_id)]))

    def _index(self, job: Job, shard: int) -> str:
        """The tenant index `job` goes in: each holds records kept alike (keys.tenant_jobs)."""
        brief = self.brief_ttl_s > 0 and job.result_ttl_s == self.brief_ttl_s
        return keys.tenant_jobs(job.model, shard, self.shards, job.tenant, brief)

    @unavailable
    async def keep(self, job: Job) -> None:
        """The default TTL and index for a record made to live briefly (scripts.KEEP)."""
        at = (job.model, shard_of(job.id), self.shards, job.tenant)
        index = [keys.tenant_jobs(*at, brief=b) for b in (True, False)]
        await self._keep(keys=[keys.job(job.id), *index], args=[self.result_ttl_s])

    # --- what the queue looks like from outside (reads only; a model's shards add up) ---
    @unavailable
    async def queue_depth(self, model: str) -> int:
        """Jobs waiting or running: acked entries are deleted, so stream lengths are it."""
        async with self.redis.pipeline(transaction=False) as p:
            for s in self.streams(model):
                p.xlen(s)
            return sum(int(n) for n in await p.execute())

    async def _sum(self, key: Callable[[str, int, int], str], model: str) -> int:
        async with self.redis.pipeline(transaction=False) as p:
            for shard in range(self.shards):
                p.get(key(model, shard, self.shards))
            return sum(int(n or 0) for n in await p.execute())

    @unavailable
    async def queued_items(self, model: str) -> int:
        return await self._sum(keys.queued_items, model)

    @unavailable
    async def queued_bytes(self, model: str) -> int:
        return await self._sum(keys.queued_bytes, model)

    @unavailable
    async def tenant_held(self, model: str, tenant: str) -> tuple[int, int, int]:
        """(items, input bytes, webhook deliveries) `tenant` holds on `model`'s shards."""
        per_tenant = (keys.tenant_items, keys.tenant_bytes, keys.tenant_webhooks)
        async with self.redis.pipeline(transaction=False) as p:
            for key in per_tenant:
                for shard in range(self.shards):
                    p.get(key(model, shard, self.shards, tenant))
            replies = [int(n or 0) for n in await p.execute()]
        n = self.shards
        return sum(replies[:n]), sum(replies[n : 2 * n]), sum(replies[2 * n :])

    @unavailable
    async def position(self, job: Job, limit: int = 1000) -> int:
        """Entries ahead of `job`: all of higher lanes plus the older ones of its own (capped),
        over every shard (entry ids of other shards compare by their time part)."""
        async with self.redis.pipeline(transaction=False) as p:
            for shard in range(self.shards):
                for lane in keys.LANES[: keys.LANES.index(job.priority)]:
                    p.xlen(keys.stream(job.model, lane, shard, self.shards))
                if job.entry:
                    own = keys.stream(job.model, job.priority, shard, self.shards)
                    p.xrange(own, "-", f"({job.entry}", count=limit)
            replies = await p.execute()
        return sum(len(r) if isinstance(r, list) else int(r) for r in replies)

    @unavailable
    async def ping(self) -> float:
        """Round trip to Redis, in ms."""
        started = time.perf_counter()
        await self.redis.ping()
        return round((time.perf_counter() - started) * 1000, 3)

    @unavailable
    async def lanes(self, models: Sequence[str]) -> dict[str, tuple[int, int | None]]:
        """Per model, over all lanes: (entries, ms timestamp of the oldest entry or None)."""
        n = len(keys.LANES) * self.shards
        async with self.redis.pipeline(transaction=False) as p:
            for m in models:
                for s in self.streams(m):
                    p.xlen(s)
                    p.xrange(s, "-", "+", count=1)
            replies = await p.execute()
        out: dict[str, tuple[int, int | None]] = {}
        for i, m in enumerate(models):
            mine = replies[2 * n * i : 2 * n * (i + 1)]
            # An entry id is `<ms>-<seq>`: the oldest entry's milliseconds.
            firsts = [int(as_str(f[0][0]).split("-", 1)[0]) for f in mine[1::2] if f]
            out[m] = (sum(int(d) for d in mine[::2]), min(firsts) if firsts else None)
        return out


RECENT = 4096  # completions remembered: this process's jobs' and its waits'


class Notifier:
    def __init__(self, redis: Redis, errors: Counter | None = None) -> None:
        self._redis = redis  # `errors`: the API's `inferq_background_errors` (None: uncounted)
        self.listener = secrets.token_hex(8)  # whom FINISH tells: jobs name it (JobProducer)
        self._supervisor = Supervisor("notifier", SURVIVE, errors)
        self._waiters: dict[str, set[asyncio.Future[bytes | None]]] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._supervisor.run(self._listen), name="notifier")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.wake_all()
        await self._redis.aclose()

    def watch(self, job_id: str) -> asyncio.Future[bytes | None]:
        """A future resolved when `job_id` may have changed, with the completion message's
        payload when there is one (`jobs.published_job`); register before reading the job."""
        fut: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        if job_id in self._recent:
            fut.set_result(None)
        self._waiters.setdefault(job_id, set()).add(fut)
        return fut

    def unwatch(self, job_id: str, fut: asyncio.Future[bytes | None]) -> None:
        waiters = self._waiters.get(job_id, set())
        waiters.discard(fut)
        if not waiters:
            self._waiters.pop(job_id, None)

    def _done(self, job_id: str, payload: bytes | None = None) -> None:
        self._recent[job_id] = None  # ids only: payloads can be large
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)
        self._wake(job_id, payload)

    def _wake(self, job_id: str, payload: bytes | None = None) -> None:
        for fut in self._waiters.pop(job_id, ()):
            if not fut.done():
                fut.set_result(payload)

    def wake_all(self) -> None:
        for job_id in list(self._waiters):
            self._wake(job_id)

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    @unavailable  # a dropped connection is an outage (one line), not a bug (a traceback)
    async def _listen(self) -> None:
        """Subscribe and hand out completions until the subscription drops (it raises: the
        supervisor backs off and calls again, and every waiter re-reads meanwhile)."""
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            # A cluster client learns the slot map on its first command, and its pubsub
            # picks a node from that map: ask something first (after a failover too).
            await self._redis.ping()
            await pubsub.psubscribe(keys.listener_pattern(self.listener))
            self.connected.set()
            self.wake_all()  # anything published while we were away: re-read
            self._supervisor.succeeded()  # subscribed: an outage ends here, not at a drop
            async for msg in pubsub.listen():
                if msg and msg.get("type") == "pmessage":
                    data = msg.get("data")
                    payload = data if isinstance(data, bytes) and data != b"final" else None
                    self._done(keys.job_id_from_channel(as_str(msg["channel"])), payload)
        except Exception:  # any drop: waiters re-read now rather than at their next timer
            self.connected.clear()
            self.wake_all()
            raise
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
