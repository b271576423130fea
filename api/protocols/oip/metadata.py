"""What the Open Inference Protocol says about the server and its models, from what each
model's workers declare (`ModelInfo`): one named input per input kind, one output per model.

| declared | OIP tensor | datatype | shape | one element / row is |
|---|---|---|---|---|
| input `text` | `text` | BYTES | [-1] | one text (UTF-8) |
| input `image` | `image` | BYTES | [-1] | one encoded JPEG, PNG or WebP file |
| input `tensor` | `tensor` | FP32 (or any inferq tensor dtype) | [-1, -1] | the first dim is the batch: one tensor per row |
| output `vector` | `vector` | FP32 | [-1, -1] | one vector per input |
| output `labels` | `labels` | BYTES | [-1, -1] | k classification strings `score:index:label`, best first |
| output `text` | `text_output` | BYTES | [-1] | one string per input |
| output `boxes` / `any` | `boxes` / `output` | BYTES | [-1] | one JSON document per input (FP32 rows when an `any` model returns an array) |

`ModelInfo` declares no tensor dtype, so a tensor input shows FP32; a request may send any
dtype inferq tensors carry. Labels use Triton's classification format, so that a Triton
client's classification output reads them unchanged; the score is printed with six decimals,
as Triton prints it.
"""

from __future__ import annotations

from typing import Any

from inferq.api.protocols.oip.tensors import BYTES
from inferq.shared.registry import ModelInfo
from inferq.shared.schema import InputKind, OutputKind

NAME = "inferq"
#: inferq serves one version of each model, under this name (the weights' own version is
#: part of the result cache's key, not the protocol's).
VERSION = "1"
PLATFORM = "inferq"
#: What this server implements beyond the core protocol.
EXTENSIONS = ("binary_tensor_data", "classification", "schedule_policy", "parameters")

INPUTS: dict[str, dict[str, Any]] = {
    InputKind.TEXT: {"name": "text", "datatype": BYTES, "shape": [-1]},
    InputKind.IMAGE: {"name": "image", "datatype": BYTES, "shape": [-1]},
    InputKind.TENSOR: {"name": "tensor", "datatype": "FP32", "shape": [-1, -1]},
}
OUTPUTS: dict[str, dict[str, Any]] = {
    OutputKind.VECTOR: {"name": "vector", "datatype": "FP32", "shape": [-1, -1]},
    OutputKind.LABELS: {"name": "labels", "datatype": BYTES, "shape": [-1, -1]},
    OutputKind.TEXT: {"name": "text_output", "datatype": BYTES, "shape": [-1]},
    OutputKind.BOXES: {"name": "boxes", "datatype": BYTES, "shape": [-1]},
    OutputKind.ANY: {"name": "output", "datatype": BYTES, "shape": [-1]},
}
#: An input's name → its kind.
INPUT_KINDS = {spec["name"]: kind for kind, spec in INPUTS.items()}


def server_metadata(version: str) -> dict[str, Any]:
    return {"name": NAME, "version": version, "extensions": list(EXTENSIONS)}


def input_kinds(info: ModelInfo | None) -> dict[str, str]:
    """The input names a model takes → their kinds; every kind while no worker has declared
    the model (the worker checks then)."""
    if info is None:
        return dict(INPUT_KINDS)
    return {INPUTS[k]["name"]: k for k in info.inputs if k in INPUTS}


def output_kind(info: ModelInfo | None) -> str:
    if info is None or info.output not in OUTPUTS:
        return OutputKind.ANY
    return info.output


def output_name(info: ModelInfo | None) -> str:
    return str(OUTPUTS[output_kind(info)]["name"])


def model_metadata(name: str, info: ModelInfo) -> dict[str, Any]:
    """A model's metadata; `parameters`: the request parameters it takes, with what each does."""
    return {
        "name": name,
        "versions": [VERSION],
        "platform": PLATFORM,
        "inputs": [INPUTS[k] for k in info.inputs if k in INPUTS],
        "outputs": [OUTPUTS[output_kind(info)]],
        "parameters": dict(info.parameters),
    }
