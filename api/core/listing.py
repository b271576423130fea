"""`GET /v1/jobs` without HTTP: a tenant's jobs, newest first, filtered, one page at a time.

The index is `keys.tenant_jobs`: two sorted sets per (model shard, tenant), the jobs kept
INFERQ_SYNC_RESULT_TTL_S and the rest, scored by creation ms, added to by the SUBMIT and
CACHED scripts in the step that makes the job (a listed job always exists; a refused one is
never listed) and trimmed with the records' lifetime (those scripts, and this reader, drop
the members whose record has expired). A page reads, from each index the caller may see,
the members below its cursor (`ZRANGE ... BYSCORE REV LIMIT`: O(log n + page)), merges them
newest first, and reads those records without inputs or outputs: two round trips, whatever
the number of jobs; no SCAN.

Filters on the record itself (`status`, `metadata`) cost a record read per job examined, so a
page examines at most `MAX_EXAMINED` jobs: one that stops there answers with what it found,
`has_more`, and as `last_id` the last job it examined, where the next page goes on.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.errors import InputInvalid
from inferq.shared.jobs import Job, decode_job
from inferq.shared.redis_conn import as_str, unavailable
from inferq.shared.schema import JobField, Status

MAX_LIMIT = 100  # jobs per page, as OpenAI's list endpoints
MAX_EXAMINED = 1000  # records a filtered page reads at most
#: What a listed job shows: its record without inputs (and without outputs unless asked).
_FIELDS = tuple(
    str(f)
    for f in JobField
    if f not in (JobField.INPUTS, JobField.OUTPUTS, JobField.PARAMETERS, JobField.CACHE)
)
_WITH_OUTPUTS = (*_FIELDS, str(JobField.OUTPUTS))
_INF = float("inf")


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What a listed job must match; all of it (None / empty: anything)."""

    status: Status | None = None
    model: str | None = None
    created_after_ms: int | None = None  # created at or after
    created_before_ms: int | None = None  # created before
    metadata: dict[str, str] = field(default_factory=dict)

    def on_record(self) -> bool:
        """Whether matching needs the record (the index knows model and creation time only)."""
        return self.status is not None or bool(self.metadata)

    def matches(self, job: Job) -> bool:
        if self.status is not None and job.status is not self.status:
            return False
        return all(job.metadata.get(k) == v for k, v in self.metadata.items())


@dataclass(slots=True)
class Page:
    jobs: list[Job]
    has_more: bool
    last_id: str | None  # `after` for the next page


@dataclass(slots=True)
class _Member:
    score: float
    key: str  # the record's key: what the index holds
    index: str

    def order(self) -> tuple[float, str]:
        return self.score, self.key


class JobListing:
    """Reads the tenant job indexes of the models this deployment serves."""

    def __init__(self, redis: Redis, models: list[str], shards: int) -> None:
        self.redis = redis
        self.models = sorted(models)
        self.shards = shards

    def indexes(self, tenants: list[str], model: str | None) -> list[str]:
        models = [model] if model is not None else self.models
        return [
            keys.tenant_jobs(m, s, self.shards, t, brief)
            for m in models
            for s in range(self.shards)
            for t in tenants
            for brief in (False, True)
        ]

    @unavailable
    async def page(
        self,
        tenants: list[str],
        filt: JobFilter,
        *,
        limit: int,
        after: str | None = None,
        outputs: bool = False,
    ) -> Page:
        """Up to `limit` of `tenants`' jobs matching `filt`, newest first, after the job `after`."""
        indexes = self.indexes(tenants, filt.model)
        top = _INF if filt.created_before_ms is None else filt.created_before_ms
        bottom = -_INF if filt.created_after_ms is None else filt.created_after_ms
        cursor = await self._cursor(after, tenants) if after else None
        found: list[Job] = []
        examined = 0
        while True:
            want = limit + 1 - len(found)  # one past the page says whether there is more
            # A record filter may skip many: read ahead, within what is left to examine.
            chunk = max(4 * want, 32) if filt.on_record() else want
            chunk = min(chunk, MAX_EXAMINED - examined)
            members, exhausted = await self._below(indexes, cursor, top, bottom, chunk)
            jobs = await self._read(members, outputs)
            examined += len(members)
            found += [j for j in jobs if j is not None and j.tenant in tenants and filt.matches(j)]
            if members:
                cursor = members[-1].order()
            if len(found) > limit:
                return Page(found[:limit], True, found[limit - 1].id)
            if exhausted:
                return Page(found, False, found[-1].id if found else None)
            if examined >= MAX_EXAMINED:
                return Page(found, True, keys.job_id_of(cursor[1]) if cursor else None)

    async def _cursor(self, after: str, tenants: list[str]) -> tuple[float, str]:
        """Where the page after job `after` starts: its place in its index."""
        where = keys.job_shard(after)
        if where is not None and where[1] < self.shards:
            model, shard = where
            key = keys.job(after)
            async with self.redis.pipeline(transaction=False) as p:
                for t in tenants:
                    for brief in (False, True):
                        p.zscore(keys.tenant_jobs(model, shard, self.shards, t, brief), key)
                for score in await p.execute():
                    if score is not None:
                        return float(score), key
        raise InputInvalid(
            f"after={after[:128]!r}: no job of yours has this id (its record may have "
            "expired); list again without `after`"
        )

    async def _below(
        self,
        indexes: list[str],
        cursor: tuple[float, str] | None,
        top: float,
        bottom: float,
        n: int,
    ) -> tuple[list[_Member], bool]:
        """The `n` newest members of all `indexes` ordered before `cursor` (newest first), and
        whether that is all of them. Members that share the cursor's ms are ordered by key."""
        # Below the cursor, or below `created_before` (exclusive), whichever is lower; the
        # members that share the cursor's ms come in a second read, ordered by key.
        tied = cursor if cursor is not None and bottom <= cursor[0] < top else None
        if cursor is not None and cursor[0] < bottom:
            return [], True  # the cursor is past the oldest the filter takes
        high = top if tied is None else tied[0]
        async with self.redis.pipeline(transaction=False) as p:
            for index in indexes:
                p.zrange(
                    index,
                    "+inf" if high == _INF else f"({_num(high)}",
                    _num(bottom),
                    desc=True,
                    byscore=True,
                    offset=0,
                    num=n,
                    withscores=True,
                )
                if tied is not None:
                    p.zrange(index, _num(tied[0]), _num(tied[0]), byscore=True, withscores=True)
            replies = await p.execute()
        runs: list[list[_Member]] = []
        full = False
        step = 2 if tied is not None else 1
        for i, index in enumerate(indexes):
            below = [_Member(float(s), as_str(m), index) for m, s in replies[i * step]]
            full = full or len(below) >= n
            if tied is not None:
                same = [
                    _Member(float(s), as_str(m), index)
                    for m, s in replies[i * step + 1]
                    if as_str(m) < tied[1]
                ]
                below = sorted(same, key=_Member.order, reverse=True) + below
            runs.append(below)
        merged = list(heapq.merge(*runs, key=_Member.order, reverse=True))
        return merged[:n], not full and len(merged) <= n

    async def _read(self, members: list[_Member], outputs: bool) -> list[Job | None]:
        """The records of `members` (None where gone: dropped from its index here)."""
        if not members:
            return []
        names = _WITH_OUTPUTS if outputs else _FIELDS
        async with self.redis.pipeline(transaction=False) as p:
            for m in members:
                p.hmget(m.key, names)
            rows = await p.execute()
        jobs: list[Job | None] = []
        gone: list[_Member] = []
        for m, row in zip(members, rows, strict=True):
            raw: dict[bytes, Any] = {
                n.encode(): v for n, v in zip(names, row, strict=True) if v is not None
            }
            if not raw:
                gone.append(m)
                jobs.append(None)
                continue
            jobs.append(decode_job(raw))
        if gone:
            async with self.redis.pipeline(transaction=False) as p:
                for m in gone:
                    p.zrem(m.index, m.key)
                await p.execute()
        return jobs


def _num(value: float) -> str:
    if value == _INF:
        return "+inf"
    if value == -_INF:
        return "-inf"
    return repr(int(value)) if value == int(value) else repr(value)
