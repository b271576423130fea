"""The batch API's Redis use is Redis Cluster safe: every script call and every MULTI of
`BatchStore` and `FileStore` touches one slot, no multi-key command spans two, no script
is queued on a pipeline; and the steps split across slots come in the crash-safe order
(record first, then `BATCHES_ACTIVE` and the tenant's index), with the leftovers of a crash
in between handled by their readers.

fakeredis here has no Lua: a spy stands in for each registered script, records its keys
and answers what the script would for this flow. What the scripts do is tested on a real
Redis (tests/integration/test_batches.py, single node and cluster)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import fakeredis
import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from inferq.api.batches.files import FileStore
from inferq.api.batches.leases import BatchLeases
from inferq.api.batches.store import BatchStore, output_ids
from inferq.shared import keys, lua
from inferq.shared.errors import JobConflict, JobNotFound
from inferq.shared.lua import batches as bs
from inferq.shared.metrics import api_metrics

TTL_S = 3600
EP = "/v1/embeddings"
MULTI_KEY = {"DEL", "UNLINK", "EXISTS", "TOUCH", "MGET", "SINTER", "SUNION", "SDIFF"}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _slots(names: Sequence[str]) -> set[int]:
    return {key_slot(n.encode()) for n in names}


def _keys_of(args: Sequence[Any]) -> list[str]:
    """The keys of one command as the spy sees it (the commands these modules use)."""
    name = _s(args[0]).upper()
    if name in MULTI_KEY:
        return [_s(a) for a in args[1:]]
    return [_s(args[1])] if len(args) > 1 else []


def _record(_k: list[str], a: list[Any]) -> list[int]:
    kinds = [_s(v)[:1] for v in a[2::2]]
    return [kinds.count("o"), kinds.count("e")]


# What each script answers in this flow (fakeredis runs no Lua). A script added to the
# store and missing here fails `SpyScript`: give it an answer, and its keys get checked.
ANSWERS: dict[str, Callable[[list[str], list[Any]], Any]] = {
    lua.source(bs.ADVANCE): lambda _k, a: a[0],
    lua.source(bs.RECORD): _record,
    lua.source(bs.BATCH_END): lambda _k, _a: 1,
    lua.source(bs.KEEP): lambda _k, _a: 1,
    lua.source(bs.RENEW): lambda _k, _a: 1,
    lua.source(bs.RELEASE): lambda _k, _a: 1,
}


class SpyScript:
    def __init__(self, spy: Spy, source: str) -> None:
        assert source in ANSWERS, f"a script the spy does not know:\n{source}"
        self.spy, self.source = spy, source
        spy.registered.add(source)

    async def __call__(
        self, keys: Sequence[str], args: Sequence[Any] = (), client: Any = None
    ) -> Any:
        self.spy.called.add(self.source)
        self.spy.check("EVALSHA", list(keys))
        if client is not None:
            self.spy.problems.append(f"a script queued on a pipeline: {list(keys)}")
        self.spy.log.append(("EVALSHA", list(keys), self.source))
        return ANSWERS[self.source](list(keys), list(args))


class Spy:
    """A fakeredis client that logs every command, script call and MULTI with its keys,
    and notes each that would span two cluster slots."""

    def __init__(self) -> None:
        self.redis = fakeredis.FakeAsyncRedis()
        self.log: list[tuple[str, list[str], str]] = []  # (what, keys, script or commands)
        self.problems: list[str] = []
        self.registered: set[str] = set()
        self.called: set[str] = set()
        r: Any = self.redis
        real_command, real_pipeline = r.execute_command, r.pipeline

        async def execute_command(*args: Any, **options: Any) -> Any:
            ks = _keys_of(args)
            self.check(_s(args[0]).upper(), ks)
            self.log.append((_s(args[0]).upper(), ks, ""))
            return await real_command(*args, **options)

        def pipeline(transaction: bool = True, shard_hint: Any = None) -> Any:
            p = real_pipeline(transaction=transaction, shard_hint=shard_hint)
            real_execute = p.execute

            async def execute(raise_on_error: bool = True) -> Any:
                cmds = [(_s(args[0]).upper(), _keys_of(args)) for args, _ in p.command_stack]
                for name, ks in cmds:
                    self.check(name, ks)
                if transaction:
                    every = [k for _, ks in cmds for k in ks]
                    self.check("MULTI", every)
                    self.log.append(("MULTI", every, " ".join(n for n, _ in cmds)))
                else:
                    self.log.extend((n, ks, "") for n, ks in cmds)
                return await real_execute(raise_on_error)

            p.execute = execute
            return p

        r.execute_command = execute_command
        r.pipeline = pipeline
        r.register_script = lambda source: SpyScript(self, source)

    def check(self, what: str, names: list[str]) -> None:
        if len(_slots(names)) > 1:
            self.problems.append(f"{what} spans slots: {names}")

    def first(self, what: str, key: str, has: str = "") -> int:
        """Where the first logged `what` on `key` (whose commands include `has`) is."""
        for i, (w, ks, detail) in enumerate(self.log):
            if w == what and key in ks and has in detail:
                return i
        raise AssertionError(f"no {what} {has} on {key} in the log")


@pytest.fixture
def spy() -> Spy:
    return Spy()


def _stores(spy: Spy) -> tuple[BatchStore, FileStore]:
    redis = cast(Redis, spy.redis)
    return BatchStore(redis, ttl_s=TTL_S), FileStore(redis, ttl_s=TTL_S)


def test_the_slot_check_is_not_vacuous() -> None:
    b = "batch_x"
    assert len(_slots([keys.batch(b), keys.batch_results(b), keys.batch_lease(b)])) == 1
    assert len(_slots([keys.file("f"), keys.file_content("f")])) == 1
    for other in (keys.BATCHES_ACTIVE, keys.batches("t"), keys.files("t"), keys.file("f")):
        assert len(_slots([keys.batch(b), other])) == 2  # what the old FINISH and MULTIs did


async def test_every_script_and_transaction_stays_in_one_slot(spy: Spy) -> None:
    store, files = _stores(spy)
    src = await files.create("t", "in.jsonl", "batch", b'{"a": 1}\n{"b": 2}\n')
    rec = await store.create(
        "t", input_file_id=src.id, endpoint=EP, window="24h", total=2, metadata={"k": "v"}
    )
    assert await store.active() == [rec.id]
    assert await store.acquire(rec.id, "me", 6000)
    assert await store.renew(rec.id, "me", 6000)
    assert await store.advance(rec.id, "in_progress", "validating") == "in_progress"
    assert await store.record(rec.id, [(1, b"o", b"{}"), (2, b"e", b"{}")]) == (1, 1)
    await store.done_lines(rec.id)
    await store.results(rec.id, [1, 2])
    out_id, err_id = output_ids(rec.id)
    await files.create("t", f"{rec.id}_output.jsonl", "batch_output", b"{}\n", file_id=out_id)
    await files.create("t", f"{rec.id}_error.jsonl", "batch_output", b"{}\n", file_id=err_id)
    assert await store.finish(rec.id, "completed", output_file_id=out_id, error_file_id=err_id)
    await store.deactivate(rec.id)
    await store.release(rec.id, "me")
    await store.cancel(rec.id, "t")
    assert [r.id for r in (await store.page("t", limit=10, after=None))[0]] == [rec.id]
    assert len((await files.page("t", limit=10, after=None, order="desc", purpose=None))[0]) == 3
    await files.delete(src.id, "t")

    assert spy.problems == []
    assert spy.called == spy.registered == set(ANSWERS)  # every script ran and was checked


async def test_create_writes_the_record_before_pointing_at_it(spy: Spy) -> None:
    store, files = _stores(spy)
    src = await files.create("t", "in.jsonl", "batch", b"{}\n")
    assert spy.first("MULTI", keys.file(src.id), "HSET") < spy.first(
        "MULTI", keys.files("t"), "ZADD"
    )
    rec = await store.create(
        "t", input_file_id=src.id, endpoint=EP, window="24h", total=1, metadata=None
    )
    keep = next(i for i, e in enumerate(spy.log) if e[2] == lua.source(bs.KEEP))
    record = spy.first("MULTI", keys.batch(rec.id), "HSET")
    active = spy.first("SADD", keys.BATCHES_ACTIVE)
    listed = spy.first("MULTI", keys.batches("t"), "ZADD")
    assert keep < record < active < listed
    await store.redis.hset(keys.batch(rec.id), "status", "completed")  # so its input may go
    await files.delete(src.id, "t")
    assert spy.first("DEL", keys.file(src.id)) < spy.first("ZREM", keys.files("t"))


async def test_create_refuses_an_input_deleted_meanwhile(
    spy: Spy, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = _stores(spy)
    monkeypatch.setitem(ANSWERS, lua.source(bs.KEEP), lambda _k, _a: 0)  # KEEP found no file
    with pytest.raises(JobNotFound, match="file-gone"):
        await store.create(
            "t", input_file_id="file-gone", endpoint=EP, window="24h", total=1, metadata=None
        )
    assert await store.active() == [] and (await store.page("t", limit=5, after=None))[0] == []


async def test_what_a_crash_between_steps_leaves_is_cleaned_up(spy: Spy) -> None:
    store, files = _stores(spy)
    r = spy.redis
    src = await files.create("t", "in.jsonl", "batch", b"{}\n")
    running, ended = "batch_running", "batch_ended"
    for b, status in ((running, "in_progress"), (ended, "completed")):
        await r.hset(keys.batch(b), mapping={"id": b, "tenant": "t", "status": status,
                                             "input_file_id": src.id})  # fmt: skip
        await r.sadd(keys.BATCHES_ACTIVE, b)
    # Listed, but the record is gone (a delete or a crash mid-way): dropped from the index.
    await r.zadd(keys.batches("t"), {"batch_gone": 1.0})
    await r.zadd(keys.files("t"), {"file-gone": 1.0})
    assert (await store.page("t", limit=5, after=None))[0] == []
    assert not await r.zscore(keys.batches("t"), "batch_gone")
    assert [
        f.id for f in (await files.page("t", limit=5, after=None, order="asc", purpose=None))[0]
    ] == [src.id]
    assert not await r.zscore(keys.files("t"), "file-gone")
    # A running batch keeps its input; one that ended (its holder died before leaving
    # BATCHES_ACTIVE) does not, and the next runner to take it drops it from the set.
    with pytest.raises(JobConflict, match=running):
        await files.delete(src.id, "t")
    await r.srem(keys.BATCHES_ACTIVE, running)
    await files.delete(src.id, "t")
    runner = BatchLeases(store, files, jobs=None, metrics=api_metrics())  # type: ignore[arg-type]
    await runner._work(ended)
    assert await store.active() == []
