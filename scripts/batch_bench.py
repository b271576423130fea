"""A large embeddings batch against a running stack, and what it does to interactive latency.

Three phases against one API (`--base-url`; a worker of `--model` must be up):

1. baseline: one client sends single-text POST /v1/embeddings requests back to back for
   `--probe-s` seconds: their p50/p99 without a batch;
2. batch: uploads `--lines` one-text /v1/embeddings lines (the `short` bench corpus,
   cycled, each line numbered so no two texts are equal) and starts the batch; the same
   one client keeps probing until the batch ends;
3. report: the batch's wall time (create → completed) and items/s, and the probe's p50/p99
   without and during the batch. `--json` writes the numbers too.

Run (the lead's full size; smoke with `--lines 300 --probe-s 3`):

    .venv/bin/python scripts/batch_bench.py --base-url http://127.0.0.1:8000 --lines 10000
"""

from __future__ import annotations

import argparse
import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from inferq.bench.corpus import load as load_corpus
from inferq.bench.stats import percentile

FINAL = ("completed", "failed", "expired", "cancelled")


def probe(base: str, key: str, model: str, stop: threading.Event, texts: list[str]) -> list[float]:
    """One client, back to back, until `stop`: latency (ms) of each 200 answer."""
    out: list[float] = []
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        i = 0
        while not stop.is_set():
            body = {"model": model, "input": f"{texts[i % len(texts)]} ({i})"}
            t0 = time.perf_counter()
            r = client.post("/v1/embeddings", json=body)
            if r.status_code == 200:
                out.append((time.perf_counter() - t0) * 1000)
            i += 1
    return out


def probed(base: str, key: str, model: str, texts: list[str], until: Any) -> list[float]:
    """Probe in a thread while `until()` (in this thread) runs."""
    stop = threading.Event()
    result: list[float] = []
    thread = threading.Thread(
        target=lambda: result.extend(probe(base, key, model, stop, texts)), daemon=True
    )
    thread.start()
    try:
        until()
    finally:
        stop.set()
        thread.join()
    return result


def summary(latencies: list[float]) -> dict[str, float]:
    return {
        "n": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--probe-s", type=float, default=20.0, help="baseline probe duration")
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="give up on the batch")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = ap.parse_args()

    texts = load_corpus("short")
    client = openai.OpenAI(
        base_url=f"{args.base_url}/v1", api_key=args.api_key, max_retries=2, timeout=60
    )
    baseline = probed(
        args.base_url, args.api_key, args.model, texts, lambda: time.sleep(args.probe_s)
    )

    lines = [
        json.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": args.model, "input": f"{texts[i % len(texts)]} ({i})"},
            }
        )
        for i in range(args.lines)
    ]
    data = ("\n".join(lines) + "\n").encode()
    upload = client.files.create(file=("bench.jsonl", io.BytesIO(data)), purpose="batch")
    state: dict[str, Any] = {}

    def run_batch() -> None:
        t0 = time.perf_counter()
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        while batch.status not in FINAL:
            if time.perf_counter() - t0 > args.timeout_s:
                raise SystemExit(f"batch {batch.id} not done after {args.timeout_s:g}s")
            time.sleep(0.25)
            batch = client.batches.retrieve(batch.id)
        state["wall_s"] = time.perf_counter() - t0
        state["batch"] = batch

    during = probed(args.base_url, args.api_key, args.model, texts, run_batch)
    batch = state["batch"]
    counts = batch.request_counts
    report = {
        "lines": args.lines,
        "model": args.model,
        "status": batch.status,
        "completed": counts.completed if counts else None,
        "failed": counts.failed if counts else None,
        "wall_s": round(state["wall_s"], 2),
        "items_per_s": round(args.lines / state["wall_s"], 1),
        "interactive_without_batch": summary(baseline),
        "interactive_during_batch": summary(during),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
