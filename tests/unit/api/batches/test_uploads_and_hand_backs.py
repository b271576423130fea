"""A file written part way leaves nothing behind (fakeredis, a write that fails mid-file), and
`hand_backs`: which batches hand their slot back to a waiting tenant (pure)."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferq.api.batches.files import CHUNK_BYTES, UPLOAD_TTL_S, FileStore
from inferq.api.batches.leases import hand_backs
from inferq.shared import keys
from inferq.shared.errors import QueueUnavailable


class FailingAfter(FileStore):
    """A store whose `put` fails (as a Redis OOM would) after `chunks` chunks."""

    def __init__(self, redis: Any, chunks: int) -> None:
        super().__init__(redis, ttl_s=3600)
        self.chunks = chunks

    async def put(self, key: str, offset: int, data: bytes) -> None:
        if offset >= self.chunks * CHUNK_BYTES:
            raise QueueUnavailable("redis unavailable: OOM command not allowed")
        await super().put(key, offset, data)


async def test_a_failed_upload_leaves_no_key() -> None:
    redis = fakeredis.FakeAsyncRedis()
    files = FailingAfter(redis, chunks=2)
    with pytest.raises(QueueUnavailable):
        await files.create("a", "big.jsonl", "batch", b"x" * (5 * CHUNK_BYTES))
    assert await redis.keys("*") == []
    assert await files.usage("a") == (0, 0)


async def test_a_whole_upload_is_renamed_into_place_with_the_file_ttl() -> None:
    redis = fakeredis.FakeAsyncRedis()
    files = FileStore(redis, ttl_s=3600)
    writer = files.writer("file-1")
    await writer.write(b"y" * (CHUNK_BYTES + 5))
    assert 0 < await redis.ttl(writer.key) <= UPLOAD_TTL_S  # not yet visible, soon gone if left
    assert not await redis.exists(keys.file_content("file-1"))
    rec = await writer.close("a", "f.jsonl", "batch")
    assert rec.size == CHUNK_BYTES + 5
    assert not await redis.exists(writer.key)
    assert await redis.strlen(keys.file_content("file-1")) == rec.size
    assert 3000 < await redis.ttl(keys.file_content("file-1")) <= 3600
    assert await files.usage("a") == (1, rec.size)


class HeldRead(FileStore):
    """A store whose usage read is answered by Redis at once (before or after `release`,
    by `answer_late`) but reaches its caller only once `release` is set."""

    def __init__(self, redis: Any, *, answer_late: bool) -> None:
        super().__init__(redis, ttl_s=3600)
        self.answer_late = answer_late
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def _usage(self, tenant: str) -> dict[str, int]:
        early = await super()._usage(tenant)
        self.reading.set()
        await self.release.wait()
        return await super()._usage(tenant) if self.answer_late else early


@pytest.mark.parametrize("answer_late", [False, True])
async def test_an_upload_landing_during_a_usage_read_is_counted_once(answer_late: bool) -> None:
    """An upload that lands while another's quota read is under way counts once: from the
    read if Redis answered after it landed, from this process's uploads if before (the race
    that once let three 4 MiB uploads past a 10 MiB quota)."""
    redis = fakeredis.FakeAsyncRedis()
    files = HeldRead(redis, answer_late=answer_late)
    await files.create("a", "old.jsonl", "batch", b"o" * 5)
    with files.uploading("a", "file-new", 7):
        read = asyncio.create_task(files.usage_with_uploads("a"))
        await files.reading.wait()
        await files.create("a", "new.jsonl", "batch", b"n" * 7, file_id="file-new")
    files.release.set()
    assert await read == (2, 12)
    files.release.clear()
    assert files._uploads.held() == 0  # nothing kept once no read is under way
    assert await FileStore(redis, ttl_s=3600).usage_with_uploads("a") == (2, 12)


async def test_uploads_being_written_count_until_they_land() -> None:
    redis = fakeredis.FakeAsyncRedis()
    files = FileStore(redis, ttl_s=3600)
    with (
        files.uploading("a", "file-1", 4),
        files.uploading("a", "file-2", 6),
        files.uploading("b", "file-3", 1),
    ):
        assert await files.usage_with_uploads("a") == (2, 10)
        assert await files.usage_with_uploads("b") == (1, 1)  # per tenant
    assert await files.usage_with_uploads("a") == (0, 0)  # failed before landing: gone
    assert files._uploads.held() == 0


async def test_a_file_whose_record_cannot_be_written_is_deleted() -> None:
    redis = fakeredis.FakeAsyncRedis()

    class NoRecord(FileStore):
        async def publish(self, rec: Any, score: float) -> None:
            raise QueueUnavailable("redis unavailable: OOM command not allowed")

    files = NoRecord(redis, ttl_s=3600)
    with pytest.raises(QueueUnavailable):
        await files.create("a", "f.jsonl", "batch", b"z" * 100)
    assert await redis.keys("*") == []


# --- hand_backs ---


def test_a_tenant_holding_every_slot_hands_one_back_to_a_waiting_one() -> None:
    held = [(f"a{i}", "a") for i in range(4)]  # longest held first
    assert hand_backs(held, {"a0", "a1", "a2", "a3"}, ["b"], 4) == ["a0"]
    # Only batches held long enough move; none: wait for the next scan.
    assert hand_backs(held, set(), ["b"], 4) == []
    # A slot already being handed back (not in `held`) is b's: no second one.
    assert hand_backs(held[1:], {"a1", "a2", "a3"}, ["b"], 4) == []
    # b holds its share (2 of 4 for 2 tenants): nothing more moves.
    held2 = [("a0", "a"), ("a1", "a"), ("b0", "b"), ("b1", "b")]
    assert hand_backs(held2, {"a0", "a1", "b0", "b1"}, ["b"], 4) == []
    # Three waiting tenants and one holding all 4: each of the others gets one.
    assert hand_backs(held, {"a0", "a1", "a2", "a3"}, ["b", "c", "d"], 4) == ["a0", "a1", "a2"]
    # More tenants than slots: each holds one, the fifth waits.
    held5 = [("a0", "a"), ("b0", "b"), ("c0", "c"), ("d0", "d")]
    assert hand_backs(held5, {"a0", "b0", "c0", "d0"}, ["e"], 4) == []
    assert hand_backs([], set(), [], 4) == []


@given(
    st.lists(st.sampled_from("abcd"), max_size=4),
    st.lists(st.sampled_from("abcde"), max_size=6),
)
def test_hand_backs_never_take_a_tenant_below_its_share(
    held_tenants: list[str], waiting: list[str]
) -> None:
    held = [(f"{t}{i}", t) for i, t in enumerate(held_tenants)]
    movable = {b for b, _ in held}
    out = hand_backs(held, set(movable), waiting, 4)
    assert len(out) == len(set(out)) and set(out) <= movable
    tenants = {t for _, t in held} | set(waiting)
    share = max(1, 4 // len(tenants)) if tenants else 4
    left = {t: sum(1 for b, u in held if u == t and b not in out) for t in tenants}
    for b, t in held:
        if b in out:
            assert left[t] >= share  # it held more than its share before handing back
    assert len(out) <= len(set(waiting))
