"""Recall@10 of the compact encodings of `/v1/embeddings` against float, on the shipped corpora
with the real minilm model: the figures docs/api.md reports ("Compact vectors").

Every text of a corpus is a query against all the others (itself excluded). Its 10 nearest
by float cosine are the truth; recall@10 is the share of them that the encoding's own top 10
finds, averaged over the queries. int8 and uint8 vectors are ranked by cosine (the per-vector
scale cancels in it; uint8 after subtracting 128), binary and ubinary ones by Hamming distance
(decoded as docs/api.md says: ubinary bytes as they are, binary bytes + 128). Ties keep
corpus order. The encodings are `inferq.api.protocols.vectors`, the very functions the API runs.

Run: .venv/bin/python -m inferq.bench.recall            (short and mixed; ~1 min on a CPU)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import numpy as np

from inferq.api.protocols import vectors
from inferq.bench import corpus
from inferq.bench.model import build
from inferq.worker.models.base import Input, InputKind, Model

K = 10
BATCH = 64
ENCODINGS = ("int8", "uint8", "binary", "ubinary")


def embed(model: Model, texts: Sequence[str]) -> np.ndarray:
    """Float vectors of `texts`, as the worker's model gives them, in batches of `BATCH`."""
    rows = []
    for at in range(0, len(texts), BATCH):
        items = model.prepare([Input(InputKind.TEXT, t) for t in texts[at : at + BATCH]], {})
        rows.append(np.asarray(model.run([p.payload for p in items]), dtype=np.float32))
    return np.concatenate(rows)


def _cosine(v: np.ndarray) -> np.ndarray:
    unit = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return unit @ unit.T  # type: ignore[no-any-return]


def _bits(packed: np.ndarray, width: int) -> np.ndarray:
    # ±1 per bit: their dot product is width − 2 · Hamming distance, so it ranks the same.
    bits = np.unpackbits(packed.astype(np.uint8), axis=1)[:, :width].astype(np.float32)
    return 2 * bits - 1  # type: ignore[no-any-return]


# Each encoding's similarity, from what the API sends (`vectors`) decoded as documented.
SCORES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "int8": lambda v: _cosine(vectors.to_int8(v).astype(np.float32)),
    "uint8": lambda v: _cosine(vectors.to_uint8(v).astype(np.float32) - 128),
    "ubinary": lambda v: (b := _bits(vectors.to_ubinary(v), v.shape[1])) @ b.T,
    "binary": lambda v: (b := _bits(vectors.to_binary(v).astype(np.int16) + 128, v.shape[1])) @ b.T,
}


def top_k(scores: np.ndarray, k: int = K) -> np.ndarray:
    """Each row's k best columns, itself excluded; ties in column order."""
    s = scores.astype(np.float64, copy=True)
    np.fill_diagonal(s, -np.inf)
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def recall_at_k(truth: np.ndarray, found: np.ndarray) -> float:
    """The mean share of each row of `truth` (top-k indices) that `found` holds."""
    hits = [len(set(t) & set(f)) for t, f in zip(truth.tolist(), found.tolist(), strict=True)]
    return float(np.mean(hits)) / truth.shape[1]


def measure(floats: np.ndarray, k: int = K) -> dict[str, float]:
    """Recall@k of each encoding against float cosine, over the rows of `floats`."""
    truth = top_k(_cosine(floats), k)
    return {name: recall_at_k(truth, top_k(SCORES[name](floats), k)) for name in ENCODINGS}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", nargs="+", default=list(corpus.CORPORA))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    model = build(args.device, "torch", "minilm")
    print(f"recall@{K} against float cosine, minilm, every text a query against the rest")
    print(f"{'corpus':8} {'texts':>6} " + " ".join(f"{e:>8}" for e in ENCODINGS))
    for name in args.corpus:
        texts = corpus.load(name)
        got = measure(embed(model, texts))
        print(f"{name:8} {len(texts):>6} " + " ".join(f"{got[e]:>8.3f}" for e in ENCODINGS))


if __name__ == "__main__":
    main()
