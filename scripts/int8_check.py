"""int8 vs fp32 ONNX minilm: items/s (batch 32, length-sorted; and one at a time) and cosine
to the torch fp32 outputs, on the shipped short corpus.

Run: .venv/bin/python scripts/int8_check.py  (exports/caches the ONNX files under .inferq/onnx)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from inferq.worker.models.minilm import MiniLM
from inferq.worker.models.minilm_onnx import MiniLMOnnx

N, BATCH = 512, 32


def main() -> None:
    with open("bench/corpus_short.jsonl") as f:
        texts = [json.loads(line)["text"] for line in f][:N]
    ref = MiniLM()
    ref.load("cpu")
    want = np.concatenate(
        [
            ref.run([p.payload for p in ref.prepare_texts(texts[i : i + BATCH])])
            for i in range(0, N, BATCH)
        ]
    )
    for variant in ("fp32", "int8"):
        m = MiniLMOnnx(variant=variant, cache_dir=Path(".inferq/onnx"))
        m.load("cpu")
        items = [p.payload for p in m.prepare_texts(texts)]
        order = sorted(range(N), key=lambda i: len(items[i]))
        m.run(items[:BATCH])  # warm up
        got = np.empty((N, m.dim), np.float32)
        t0 = time.perf_counter()
        for k in range(0, N, BATCH):
            idx = order[k : k + BATCH]
            got[idx] = m.run([items[i] for i in idx])
        batched = N / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for it in items[:100]:
            m.run([it])
        single = 100 / (time.perf_counter() - t0)
        cos = (got * want).sum(axis=1)
        print(
            f"{variant}: batch {BATCH} {batched:.0f} items/s, one at a time {single:.0f} items/s, "
            f"cosine to torch fp32 min {cos.min():.4f} mean {cos.mean():.4f}"
        )


if __name__ == "__main__":
    main()
