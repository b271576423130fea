"""The heartbeat writes whatever snapshot it is handed, on a real Redis (its entry refresh is
a Lua script), and never steals back entries another worker has taken over."""

from __future__ import annotations

from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.registry import WorkerBeat, WorkerRegistry, decode_beat
from inferq.worker.heartbeat import Heartbeat, Snapshot


def _beat(now: int) -> WorkerBeat:
    return WorkerBeat(
        id="w1", host="h", pid=7, model="echo", backend="echo", device="cpu", token_ceiling=512,
        items_per_s=3.5, last_batch_size=4, last_batch_tokens=40, last_batch_at_ms=now,
        batches=9, ooms=1, held_items=2, beat_ms=now, mem_allocated=1, mem_reserved=2,
        mem_total=3, calibration='{"fit": 1}',
    )  # fmt: skip


async def test_a_beat_writes_the_record_and_refreshes_held_entries_unless_stuck(
    redis_url: str,
) -> None:
    r = Redis.from_url(redis_url)
    await r.xgroup_create(keys.stream("echo"), keys.GROUP, id="0", mkstream=True)
    eid = (await r.xadd(keys.stream("echo"), {"job": "j1"})).decode()
    await r.xreadgroup(keys.GROUP, "w1", {keys.stream("echo"): ">"})
    now = 1_700_000_000_000
    snap = Snapshot(_beat(now), held={keys.stream("echo"): [eid]})
    calls: list[Snapshot] = []

    def snapshot() -> Snapshot:
        calls.append(snap)
        return snap

    class Spy(WorkerRegistry):
        refreshed: list[object] = []

        async def beat(self, beat, ttl_ms, refresh=None):  # type: ignore[no-untyped-def]
            self.refreshed.append(refresh)
            await super().beat(beat, ttl_ms, refresh)

    hb = Heartbeat(Spy(r), period_s=1, ttl_s=5, stuck_after_s=30)
    await hb.beat(snapshot)
    assert calls == [snap]
    record = decode_beat(await r.hgetall(keys.worker("w1")))
    assert record["token_ceiling"] == 512 and record["items_per_s"] == 3.5
    assert record["calibration"] == {"fit": 1}
    assert 0 < await r.pttl(keys.worker("w1")) <= 5000
    assert await r.zscore(keys.workers("echo"), "w1") == now + 5000
    assert await WorkerRegistry(r).live("echo", now) == ["w1"]
    (pending,) = await r.xpending_range(keys.stream("echo"), keys.GROUP, "-", "+", 10)
    assert pending["times_delivered"] == 1  # JUSTID: refreshed, not redelivered

    snap = Snapshot(_beat(now), held={keys.stream("echo"): [eid]}, stuck=True)
    await hb.beat(snapshot)  # stuck: the entries are left to age, so another worker can take them
    assert Spy.refreshed == [{keys.stream("echo"): [eid]}, None]
    await hb.unregister("w1", "echo")
    assert not await r.exists(keys.worker("w1"))
    assert await WorkerRegistry(r).live("echo", now) == []
    await r.aclose()


async def test_a_resumed_worker_does_not_steal_back_what_was_taken_over(redis_url: str) -> None:
    r = Redis.from_url(redis_url)
    s = keys.stream("echo")
    await r.xgroup_create(s, keys.GROUP, id="0", mkstream=True)
    mine = (await r.xadd(s, {"job": "kept"})).decode()
    taken = (await r.xadd(s, {"job": "taken"})).decode()
    await r.xreadgroup(keys.GROUP, "w1", {s: ">"})  # w1 holds both
    await r.xclaim(s, keys.GROUP, "w2", 0, [taken])  # w1 froze; w2 took one over
    lost: list[dict[str, list[str]]] = []
    now = 1_700_000_000_000
    hb = Heartbeat(WorkerRegistry(r), period_s=1, ttl_s=5, stuck_after_s=30)
    await hb.beat(lambda: Snapshot(_beat(now), held={s: [mine, taken]}), lost.append)
    assert lost == [{s: [taken]}]
    owners = {p["message_id"].decode(): p["consumer"].decode()
              for p in await r.xpending_range(s, keys.GROUP, "-", "+", 10)}  # fmt: skip
    assert owners == {mine: "w1", taken: "w2"}
    await r.aclose()
