"""The worker's prepare cost per job: one `prepare` per job against one `prepare_many` for all
the jobs of a claim (minilm's tokenizer, the `short` corpus, one input a job), side by side
in one run and alternated, medians: wall µs per job (how long the prepare thread holds the
claim) and CPU µs per job (process time: the tokenizer's own threads count too). Then the
tokenizer's batch calls on the same texts, one after the other, each to the ids: `encode_batch`
(with character offsets) against `encode_batch_fast` (without), both by the tokenizer as
loaded, and `TextTokenizer.ids` (plain ASCII from its pieces' remembered ids: what
`minilm.encode` calls), its memory warm: the corpus has a few hundred distinct words. Last,
real prose from a cold start: the sentences of Python's own documentation (`pydoc_data`,
3,000-odd distinct words, a tenth of the sentences not ASCII), once through, in calls of
`--jobs` texts, by a new `TextTokenizer` (its learning counted) and by `encode_batch_fast`,
then through the same `TextTokenizer` again (every piece learned).

Run: .venv/bin/python scripts/prepare_cost.py [--jobs 1,8,32,128] [--rounds 200]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable

from tokenizers import Tokenizer

from inferq.bench import corpus
from inferq.worker.models.base import Input, InputKind
from inferq.worker.models.minilm_null import MiniLMNull
from inferq.worker.models.tokens import TextTokenizer


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
        " | TextTokenizer.ids |"
    )
    print("|---|---|---|---|")
    for n in (int(j) for j in args.jobs.split(",")):
        batch = [texts[i % len(texts)] for i in range(n)]
        full = _median(lambda b=batch: [e.ids for e in tokenizer.encode_batch(b)], n, args.rounds)
        fast = _median(lambda b=batch: _fast_ids(tokenizer, b), n, args.rounds)
        ids = _median(lambda b=batch: tokens.ids(b), n, args.rounds)
        cells = " | ".join(f"{w:.1f} / {c:.1f}" for w, c in (full, fast, ids))
        print(f"| {n} | {cells} |")
    prose = _prose()
    print(
        f"\n| prose ({len(prose)} sentences), texts a call | encode_batch_fast: CPU µs per text"
        " | TextTokenizer.ids, cold | again, warm | pieces remembered |"
    )
    print("|---|---|---|---|---|")
    for n in (int(j) for j in args.jobs.split(",")):
        calls = [prose[i : i + n] for i in range(0, len(prose), n)]
        cold = TextTokenizer(tokenizer)
        fast_cpu, cold_cpu = 0.0, 0.0
        for batch in calls:  # alternated call by call
            c0 = time.process_time()
            want = _fast_ids(tokenizer, batch)
            c1 = time.process_time()
            got = cold.ids(batch)
            c2 = time.process_time()
            assert got == want, "TextTokenizer.ids differs from the tokenizer as loaded"
            fast_cpu, cold_cpu = fast_cpu + c1 - c0, cold_cpu + c2 - c1
        c0 = time.process_time()
        for batch in calls:  # again, every piece learned
            cold.ids(batch)
        warm_cpu = time.process_time() - c0
        per = 1e6 / len(prose)
        cells = " | ".join(f"{c * per:.1f}" for c in (fast_cpu, cold_cpu, warm_cpu))
        print(f"| {n} | {cells} | {len(cold.words)} |")


def _fast_ids(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tokenizer.encode_batch_fast(texts)]


def _prose() -> list[str]:
    """Python's documentation cut into sentences of 5 to 60 words, in order."""
    import pydoc_data.topics

    text = " ".join(pydoc_data.topics.topics.values())
    sentences = (" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+|\n\s*\n", text))
    return [s for s in sentences if 5 <= len(s.split()) <= 60]


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
