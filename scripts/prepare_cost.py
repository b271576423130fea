"""The worker's prepare cost per job: one `prepare` per job against one `prepare_many` for all
the jobs of a claim (minilm's tokenizer, the `short` corpus, one input a job), side by side
in one run and alternated, medians: wall µs per job (how long the prepare thread holds the
claim) and CPU µs per job (process time: the tokenizer's own threads count too). Then the
tokenizer's batch calls on the same texts, one after the other: `encode_batch` (with character
offsets) against `encode_batch_fast` (without), both by the tokenizer as loaded, and
`TextTokenizer.encode` (without offsets, plain ASCII through the twin without BERT's
normalizer: what `minilm.encode` calls).

Run: .venv/bin/python scripts/prepare_cost.py [--jobs 1,8,32,128] [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from inferq.bench import corpus
from inferq.worker.models.base import Input, InputKind
from inferq.worker.models.minilm_null import MiniLMNull


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", default="1,8,32,128")
    p.add_argument("--rounds", type=int, default=200)
    args = p.parse_args()
    model = MiniLMNull()  # minilm's tokenizer, nothing else: what prepare costs
    model.load("cpu")
    texts = corpus.load("short")
    print(
        "| jobs a claim | one prepare a job: wall / CPU µs per job | prepare_many: wall / CPU µs per job |"
    )
    print("|---|---|---|")
    for n in (int(j) for j in args.jobs.split(",")):
        jobs = [([Input(InputKind.TEXT, texts[i % len(texts)])], {}) for i in range(n)]
        one = _median(lambda js=jobs: [model.prepare(i, p) for i, p in js], n, args.rounds)
        many = _median(lambda js=jobs: model.prepare_many(js), n, args.rounds)
        print(f"| {n} | {one[0]:.1f} / {one[1]:.1f} | {many[0]:.1f} / {many[1]:.1f} |")
    tokens = model._tokenizer
    assert tokens is not None
    tokenizer = tokens.tokenizer
    print(
        "\n| texts a call | encode_batch: wall / CPU µs per text | encode_batch_fast"
        " | TextTokenizer.encode |"
    )
    print("|---|---|---|---|")
    for n in (int(j) for j in args.jobs.split(",")):
        batch = [texts[i % len(texts)] for i in range(n)]
        full = _median(lambda b=batch: tokenizer.encode_batch(b), n, args.rounds)
        fast = _median(lambda b=batch: tokenizer.encode_batch_fast(b), n, args.rounds)
        twin = _median(lambda b=batch: tokens.encode(b), n, args.rounds)
        cells = " | ".join(f"{w:.1f} / {c:.1f}" for w, c in (full, fast, twin))
        print(f"| {n} | {cells} |")


def _median(run: Callable[[], object], n: int, rounds: int) -> tuple[float, float]:
    """(wall, CPU) µs per job: medians of 5 windows of `rounds` calls each."""
    run()  # warm
    walls, cpus = [], []
    for _ in range(5):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            run()
        walls.append(1e6 * (time.perf_counter() - w0) / (rounds * n))
        cpus.append(1e6 * (time.process_time() - c0) / (rounds * n))
    return statistics.median(walls), statistics.median(cpus)


if __name__ == "__main__":
    main()
