"""The model alone, no server: one item at a time, then length-sorted batches.

Run as `python -m inferq.bench.ceiling CORPUS DURATION_S` (env BENCH_DEVICE, BENCH_BACKEND) in
its own process, so its peak memory is the model's alone; prints one JSON line of rows.
Single: prepare + run per item, texts in corpus order. Batched: the whole corpus sorted
by length and cut into batches of 8/16/32 (32 is inferq's INFERQ_MAX_BATCH_SIZE), run
in a seeded random order so a time-bounded pass still sees every length, in two layouts
on a CPU (torch): one batch at a time on every core, and one batch per core at once on one
thread each (what the inferq worker does by default); the best size and layout win.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

from inferq.bench import corpus, stats
from inferq.bench.model import from_env
from inferq.bench.procs import peak_rss_mb
from inferq.worker.plan import cpu_cores

BATCH_SIZES = (8, 16, 32)


def _peak_mb(device: str) -> float:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    return peak_rss_mb(os.getpid())


def _single(model: Any, texts: list[str], duration_s: float) -> dict[str, float]:
    lat: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < duration_s and len(lat) < len(texts) * 10:
        s = time.perf_counter()
        model.run([p.payload for p in model.prepare_texts([texts[len(lat) % len(texts)]])])
        lat.append((time.perf_counter() - s) * 1000)
    return stats.summarize(lat, time.perf_counter() - t0, 0) | {
        "mean_batch": 1.0,
        "padding_eff": 1.0,
    }


def _batched(payloads: list[Any], bs: int, duration_s: float, streams: int) -> dict[str, Any]:
    """Length-sorted batches of `bs`, `streams` of them running at once (one thread each)."""
    order = sorted(range(len(payloads)), key=lambda i: len(payloads[i]))
    batches = [order[i : i + bs] for i in range(0, len(order), bs)]
    random.Random(bs).shuffle(batches)
    todo = iter(batches * 10)
    lock = threading.Lock()
    lat: list[float] = []
    items = 0
    t0 = time.perf_counter()

    def stream() -> None:
        nonlocal items
        while time.perf_counter() - t0 < duration_s:
            with lock:
                b = next(todo, None)
            if b is None:
                return
            s = time.perf_counter()
            model_run([payloads[i] for i in b])
            with lock:
                lat.append((time.perf_counter() - s) * 1000)
                items += len(b)

    threads = [threading.Thread(target=stream) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    eff = stats.packed_efficiency(stats.sorted_batches([len(p) for p in payloads], bs))
    row = stats.summarize(lat, elapsed, 0)  # latencies here are per batch
    return row | {"items_per_s": items / elapsed, "mean_batch": float(bs), "padding_eff": eff}


def layouts(device: str, backend: str, model: Any) -> list[tuple[int, int]]:
    """(batches at once, threads per batch) to try; 0 threads = leave the runtime's setting."""
    cores = cpu_cores()
    # One thread per batch only where the thread count can be changed here (torch) and a
    # batch does not hold the GIL (traced); ONNX Runtime fixes its threads per session.
    if device == "cpu" and backend == "torch" and getattr(model, "traced", False) and cores > 1:
        return [(1, cores), (cores, 1)]
    return [(1, 0)]


model_run: Any = None


def measure(corpus_name: str, duration_s: float) -> list[dict[str, Any]]:
    global model_run
    device = os.environ.get("BENCH_DEVICE", "cpu")
    model = from_env()
    model_run = model.run
    texts = corpus.load(corpus_name)
    payloads = [p.payload for p in model.prepare_texts(texts)]
    model.run(payloads[:8])  # warm-up: first call allocates
    single = _single(model, texts, duration_s)
    best: dict[str, Any] = {}
    plans = layouts(device, os.environ.get("BENCH_BACKEND", "torch"), model)
    for streams, threads in plans:
        if threads:
            import torch

            torch.set_num_threads(threads)
        for bs in BATCH_SIZES:
            row = _batched(payloads, bs, duration_s / (2 * len(plans)), streams)
            if row["items_per_s"] > best.get("items_per_s", 0.0):
                best = row | {
                    "layout": f"{streams} batch(es) at once × {threads or 'default'} thread(s)"
                }
    mem = _peak_mb(device)
    return [
        {"mode": "ceiling-1", **single, "peak_mem_mb": mem},
        {"mode": "ceiling-batch", **best, "peak_mem_mb": mem},
    ]


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], float(sys.argv[2]))))
