"""The shipped benchmark corpora: deterministic, seeded, one JSON object per line.

`short`: sentences of 9-14 words (~15 tokens with [CLS]/[SEP]).
`mixed`: a long-tailed mix, log-normal word counts (median 24 words) clipped to 3..230
words, so the longest ones reach the model's 256-token limit.

Regenerate with `python -m inferq.bench.corpus` (the files must come out byte-identical).
`images` is not a file: `bench/images.py` builds it in memory at bench time. Nor is `echo`:
it sends the `short` texts to the `echo` model at zero delay, so what is measured is the path
(HTTP, Redis, worker), not a model.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPORA = ("short", "mixed")  # the shipped text corpora
IMAGE_CORPORA = ("images",)
ECHO_CORPORA = ("echo",)
# Which model each corpus is measured with: a run starts each system once per model.
MODELS = {"short": "minilm", "mixed": "minilm", "images": "efficientnet-lite0", "echo": "echo"}
SEED = 20240606
SIZES = {"short": 1000, "mixed": 600}

_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his her they this be are "
    "have had not but what all were when we there can an your which their said if will "
    "each about how up out them then she many some so these would other into has more "
    "two like time could no way people my than first water been called who oil its now "
    "find long down day did get come made may part over new sound take only little work "
    "know place year live me back give most very after thing our just name good sentence "
    "man think say great where help through much before line right too mean old any same "
    "tell boy follow came want show also around form three small set put end does another "
    "well large must big even such because turn here why ask went men read need land "
    "different home us move try kind hand picture again change off play spell air away "
    "animal house point page letter mother answer found study still learn should america "
    "world high every near add food between own below country plant last school father "
    "keep tree never start city earth eye light thought head under story saw left few "
    "while along might close something seem next hard open example begin life always "
    "those both paper together got group often run important until children side feet "
    "car mile night walk white sea began grow took river four carry state once book hear "
    "stop without second later miss idea enough eat face watch far indian real almost let "
    "above girl sometimes mountains cut young talk soon list song being leave family"
)
_WORDS = _WORD_TEXT.split()


def _sentence(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(n_words)]
    words[0] = words[0].capitalize()
    return " ".join(words) + "."


def generate(name: str, n: int | None = None, seed: int = SEED) -> list[str]:
    """The corpus `name` as a list of texts; same seed, same texts, on any machine."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}: want one of {CORPORA}")
    rng = random.Random(f"{seed}:{name}")
    count = SIZES[name] if n is None else n
    if name == "short":
        return [_sentence(rng, rng.randint(9, 14)) for _ in range(count)]
    out = []
    for _ in range(count):
        words = round(rng.lognormvariate(math.log(24), 0.9))
        out.append(_sentence(rng, min(max(words, 3), 230)))
    return out


def model_for(name: str) -> str:
    """The model the corpus `name` is measured with; ValueError for an unknown corpus."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown corpus {name!r}: want one of {sorted(MODELS)}") from None


def path(name: str) -> Path:
    return HERE / f"corpus_{name}.jsonl"


def dumps(texts: list[str]) -> str:
    return "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts))


def load(name: str) -> list[str]:
    """Texts of the shipped corpus file `name`, in file order."""
    lines = path(name).read_text().splitlines()
    return [json.loads(line)["text"] for line in lines if line.strip()]


def main() -> None:
    for name in CORPORA:
        path(name).write_text(dumps(generate(name)))


if __name__ == "__main__":
    main()
