"""OOM recovery over real processes: split, lower the live ceiling, creep back, too_large."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import httpx

from inferq.shared import keys
from inferq.worker.models.echo import expected_vector
from tests.integration.stack import ROOT, Stack, wait_for

SPEC = "oom=tests.fixtures.oom:OomEcho"
ARTIFACTS = ROOT / "test-artifacts"


def _set_threshold(path: Path, tokens: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(tokens))
    os.replace(tmp, path)  # atomic: the worker re-reads it on every batch


def _ceiling(stack: Stack) -> int:
    ids = stack.r.zrange(keys.workers("oom"), 0, -1)
    return int(stack.r.hget(keys.worker(ids[0].decode()), "token_ceiling") or 0) if ids else 0


async def _burst(base: str, texts: list[str]) -> list[dict]:
    async with httpx.AsyncClient(timeout=60) as c:
        replies = await asyncio.gather(
            *(c.post(f"{base}/v1/infer", json={"input": t}) for t in texts)
        )
    return [r.json() | {"http": r.status_code} for r in replies]


def test_oom_splits_lowers_ceiling_recovers_and_fails_only_too_large(
    stack: Stack, tmp_path: Path
) -> None:
    threshold = tmp_path / "oom-threshold"
    oom_log = tmp_path / "oom.log"
    _set_threshold(threshold, 40)
    stack.worker(
        model=SPEC, models="oom", max_batch_tokens=400, max_batch_size=32, ceiling_recover_after=3,
        echo_batch_delay_ms=30, test_oom_file=threshold, test_oom_log=oom_log, heartbeat_s=0.1,
        max_wait_ms=50,
    )  # fmt: skip
    base = stack.api(model="oom", models="oom")
    texts = [f"four words item {i}" for i in range(64)]  # cost 4 each
    first = asyncio.run(_burst(base, texts))
    assert all(j["http"] == 200 and j["status"] == "succeeded" for j in first), first
    assert [j["outputs"][0] for j in first] == [expected_vector(t) for t in texts]
    assert max(j["timings"]["batch_tokens"] for j in first) <= 40  # what ran, fit
    ooms = oom_log.read_text().splitlines()
    assert ooms, "the burst should have hit the injected limit"
    lowered = _ceiling(stack)
    assert lowered < 400

    # The device "grows": successes raise the live ceiling again, step by step.
    _set_threshold(threshold, 1000)
    for round_ in range(6):
        asyncio.run(_burst(base, [f"four words again {round_}-{i}" for i in range(32)]))
    wait_for(lambda: _ceiling(stack) > lowered, 10, "the ceiling to rise after successes")
    assert _ceiling(stack) <= 400  # never above the configured ceiling

    # An item that cannot fit even alone fails its own job, and only that job.
    _set_threshold(threshold, 20)
    big = " ".join(["w"] * 30)
    small = [f"fine {i}" for i in range(8)]
    results = asyncio.run(_burst(base, [big, *small]))
    assert results[0]["http"] == 413 and results[0]["error"]["code"] == "too_large"
    assert all(r["http"] == 200 and r["status"] == "succeeded" for r in results[1:])
    metrics = httpx.get(f"{base}/v1/health", timeout=5).json()["models"]["oom"]["workers"][0]
    assert metrics["ooms"] >= len(ooms)
    log = stack.procs[0].log_path.read_text()
    path = re.findall(r"live ceiling (?:raised )?(\d+) -> (\d+)", log)
    jobs = len(first) + 6 * 32 + len(results)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "oom.json").write_text(json.dumps({
        "jobs": jobs, "jobs_lost": 0, "too_large": 1, "ooms": metrics["ooms"],
        "batches_split": log.count("out of memory at items=") - log.count("items=1 cost="),
        "ceiling_path": [int(path[0][0])] + [int(b) for _, b in path] if path else [],
    }, indent=2))  # fmt: skip
