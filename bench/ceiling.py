"""The model alone, no server: one item at a time, then batches at their best size and layout.

Run as `python -m inferq.bench.ceiling CORPUS DURATION_S` (env BENCH_DEVICE, BENCH_BACKEND) in
its own process, so its peak memory is the model's alone; prints one JSON line of rows.
Single: prepare + run per item, in corpus order. Batched: batches in a seeded random order, so
a time-bounded pass still sees every kind of item, in two layouts on a CPU (torch): one batch
at a time on every core, and one batch per core at once on one thread each (what the inferq
worker does by default); the best size and layout win.

Text (minilm): the corpus is prepared up front (tokenizing is ~1 % of a batch's time), sorted
by length and cut into batches of 8/16/32 (32 is inferq's INFERQ_MAX_BATCH_SIZE).
Images (efficientnet-lite0): each batch is prepare (decode, resize, crop) + run, because
decoding is a real share of an image's cost (~3 ms against ~25 ms of net per image on the
2-core box) that every server pays too; sizes 1/2/4/8/16/32, since on that CPU batches over
2 images run slower per image (a batch's activations no longer fit in the cache).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferq.bench import corpus, stats
from inferq.bench.model import build
from inferq.bench.procs import peak_rss_mb
from inferq.worker.plan import cpu_cores

TEXT_BATCH_SIZES = (8, 16, 32)
IMAGE_BATCH_SIZES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Workload:
    """What the ceiling runs: `items` cut into batches, each batch run by `run_batch`."""

    items: list[Any]  # text: prepared payloads; images: encoded inputs (prepared per batch)
    costs: list[int]  # per item: the sort key for batches and the padding measure
    run_batch: Callable[[list[Any]], object]
    run_one: Callable[[int], object]  # item i alone, prepare included
    batch_sizes: tuple[int, ...]


def text_workload(model: Any, texts: list[str]) -> Workload:
    payloads = [p.payload for p in model.prepare_texts(texts)]

    def one(i: int) -> object:
        return model.run([p.payload for p in model.prepare_texts([texts[i]])])

    return Workload(payloads, [len(p) for p in payloads], model.run, one, TEXT_BATCH_SIZES)


def image_workload(model: Any) -> Workload:
    from inferq.bench import images
    from inferq.worker.models.base import Input, InputKind
    from inferq.worker.models.efficientnet import PIXELS

    inputs = [Input(InputKind.IMAGE, f.data) for f in images.load()]

    def batch(b: list[Any]) -> object:
        return model.run([p.payload for p in model.prepare(b, {})])

    def one(i: int) -> object:
        return batch([inputs[i]])

    return Workload(inputs, [PIXELS] * len(inputs), batch, one, IMAGE_BATCH_SIZES)


def _peak_mb(device: str) -> float:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    return peak_rss_mb(os.getpid())


def _single(w: Workload, duration_s: float) -> dict[str, float]:
    lat: list[float] = []
    n = len(w.items)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < duration_s and len(lat) < n * 10:
        s = time.perf_counter()
        w.run_one(len(lat) % n)
        lat.append((time.perf_counter() - s) * 1000)
    return stats.summarize(lat, time.perf_counter() - t0, 0) | {
        "mean_batch": 1.0,
        "padding_eff": 1.0,
    }


def _batched(w: Workload, bs: int, duration_s: float, streams: int) -> dict[str, Any]:
    """Cost-sorted batches of `bs`, `streams` of them running at once (one thread each)."""
    order = sorted(range(len(w.items)), key=lambda i: w.costs[i])
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
            w.run_batch([w.items[i] for i in b])
            with lock:
                lat.append((time.perf_counter() - s) * 1000)
                items += len(b)

    threads = [threading.Thread(target=stream) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    eff = stats.packed_efficiency(stats.sorted_batches(w.costs, bs))
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


def measure(corpus_name: str, duration_s: float) -> list[dict[str, Any]]:
    device = os.environ.get("BENCH_DEVICE", "cpu")
    backend = os.environ.get("BENCH_BACKEND", "torch")
    model = build(device, backend, corpus.model_for(corpus_name))
    if corpus_name in corpus.IMAGE_CORPORA:
        w = image_workload(model)
    else:
        w = text_workload(model, corpus.load(corpus_name))
    w.run_batch(w.items[:8])  # warm-up: first call allocates
    single = _single(w, duration_s)
    best: dict[str, Any] = {}
    plans = layouts(device, backend, model)
    for streams, threads in plans:
        if threads:
            import torch

            torch.set_num_threads(threads)
        for bs in w.batch_sizes:
            row = _batched(w, bs, duration_s / (2 * len(plans)), streams)
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
