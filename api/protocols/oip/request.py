"""The Open Inference Protocol's infer request (KServe v2 / Triton, REST) without HTTP: the
body (a JSON header, then binary tensors) → `OipRequest` → an inferq `Submission`.

The body: with an `Inference-Header-Content-Length` header, that many bytes of JSON, then
the inputs' binary data back to back, each `parameters.binary_data_size` long, in input
order (`oip_tensors` for the encodings); without it, JSON only. A body compressed with
`Content-Encoding: gzip` or `deflate` (tritonclient's `request_compression_algorithm`) is
inflated first, and bodies in flight are bounded per process: both are `oip_body`'s.

Request → job:
- one input tensor per request (an inferq job takes one input kind): each element of a
  `text` BYTES tensor is a text, each element of an `image` BYTES tensor one encoded image
  (binary data; base64 in JSON, where raw bytes cannot go), and a `tensor` of shape
  [n, ...] is n tensors of shape [...]; every element (row) is one input of the job, so the
  output has one row per element;
- parameters: `priority` (the schedule policy: 1 → high, 0 (unset) and 2 → normal, 3 and
  above → low), `timeout` (µs → the job's deadline; 0 → INFERQ_JOB_TIMEOUT_S),
  `binary_data_output`; every other parameter goes to the model as a job parameter (names
  the model does not declare are refused, 400); sequences and Triton's reserved names, 400;
- an output's `classification: k` keeps the k best labels, and gives a model that takes
  `top_k` that k unless the request names `top_k` itself.

Limits, before any tensor data is decoded: the JSON header against INFERQ_MAX_JSON_VALUES,
the number of inputs and outputs (one each: counted before any is looked at), every shape's
dimensions (at most INFERQ_MAX_BODY_BYTES elements, zeros aside: 400), the job's inputs
(elements, rows) against INFERQ_MAX_INPUTS_PER_JOB, a tensor row's bytes against
INFERQ_MAX_TENSOR_BYTES (413). Every refusal names the input (400), and quotes at most a
bounded prefix of what it refuses.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from inferq.api.core.decode import InputItem, Submission, TensorItem, TensorSpec, check_json_budget
from inferq.api.protocols.oip.body import split_body
from inferq.api.protocols.oip.metadata import VERSION, input_kinds, output_kind, output_name
from inferq.api.protocols.oip.tensors import (
    BYTES,
    NUMERIC,
    Tensor,
    byte_size,
    check_datatype,
    check_shape,
    from_binary,
    from_json,
)
from inferq.shared.errors import InputInvalid, InputTooLarge, ModelNotServed
from inferq.shared.registry import ModelInfo
from inferq.shared.schema import InputKind, Lane, OutputKind
from inferq.shared.settings import Settings

#: OIP datatypes an inferq tensor input carries → its dtype name (`TENSOR_DTYPES`).
TENSOR_DTYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
#: Parameters Triton reserves that inferq does not implement (refused, not ignored).
UNSUPPORTED = ("sequence_id", "sequence_start", "sequence_end", "headers")
MAX_TIMEOUT_US = 86_400 * 1_000_000  # a day: as /v1's timeout_s
#: An inferq job takes one input kind, and a model gives one output: a request names at most
#: this many of each, counted before any is decoded (150k empty inputs cost nothing then).
MAX_TENSORS = 1
#: Names a refusal quotes of a list it refuses (each cut at 64 characters): enough to see the
#: mistake, never the whole list back in the response and the log line.
QUOTED_NAMES = 3


@dataclass(frozen=True, slots=True)
class Output:
    """A requested output: `binary` None leaves it to the request's `binary_data_output`;
    `classification` 0 asks for no classification."""

    name: str
    binary: bool | None = None
    classification: int = 0


@dataclass(slots=True)
class OipRequest:
    id: str | None
    inputs: list[Tensor]
    outputs: list[Output] | None  # None: every output
    binary_output: bool = False
    priority: str = Lane.NORMAL  # inferq's, from the OIP's number (`_policy`)
    timeout_s: float | None = None
    parameters: dict[str, Any] = field(default_factory=dict)  # the model's

    def output(self, name: str) -> Output:
        """How output `name` is wanted (as requested, or by the request's defaults)."""
        for o in self.outputs or ():
            if o.name == name:
                return o
        return Output(name)

    def binary(self, name: str) -> bool:
        wanted = self.output(name).binary
        return self.binary_output if wanted is None else wanted


def check_version(model: str, version: str | None) -> None:
    """A URL's model version: inferq serves one, `VERSION`; any other 404."""
    if version not in (None, "", VERSION):
        raise ModelNotServed(
            f"model {model[:64]!r} has no version {version[:32]!r}; inferq serves version "
            f"{VERSION!r} of each model"
        )


def parse_infer(
    raw: bytes | bytearray,
    header_length: str | None,
    settings: Settings,
    max_tensors: int = MAX_TENSORS,
) -> OipRequest:
    """An infer request's body, decoded and checked against the limits (not yet against a
    model: `submission` does that). `max_tensors`: the inputs (and the outputs) a request
    may name, counted before any is decoded; the protocol allows many, an inferq job one."""
    header, binary = split_body(raw, header_length)
    check_json_budget(header, settings)  # before a parse that would build every value
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError as e:
        raise InputInvalid(f"the request's JSON does not parse: {e}") from e
    if not isinstance(doc, dict):
        raise InputInvalid("the request must be a JSON object")
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise InputInvalid("id must be a string")
    inputs = _inputs(doc.get("inputs"), binary, settings, max_tensors)
    req = OipRequest(rid, inputs, _outputs(doc, max_tensors))
    _policy(req, _object(doc.get("parameters"), "parameters"))
    return req


def quote_names(specs: Sequence[object]) -> str:
    """The first `QUOTED_NAMES` names of a list of tensors, each cut at 64 characters, and how
    many more there are: what a refusal of the list quotes."""
    shown = [
        repr(s["name"][:64]) if isinstance(s, dict) and isinstance(s.get("name"), str) else "?"
        for s in specs[:QUOTED_NAMES]
    ]
    more = len(specs) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


def _object(value: object, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputInvalid(f"{what} must be a JSON object")
    return value


def _uint(params: dict[str, Any], key: str) -> int:
    value = params.pop(key, 0)
    if type(value) is not int or value < 0:
        raise InputInvalid(f"parameter {key!r} must be a non-negative integer, not {value!r:.32}")
    return value


def _policy(req: OipRequest, params: dict[str, Any]) -> None:
    """The request's own parameters (schedule policy, binary output) out of `params`; what
    is left is the model's."""
    params = dict(params)
    priority = _uint(params, "priority")
    req.priority = Lane.HIGH if priority == 1 else Lane.LOW if priority >= 3 else Lane.NORMAL
    timeout_us = _uint(params, "timeout")
    if timeout_us > MAX_TIMEOUT_US:
        raise InputInvalid(f"parameter 'timeout' is {timeout_us} µs, over a day ({MAX_TIMEOUT_US})")
    req.timeout_s = timeout_us / 1e6 if timeout_us else None
    binary = params.pop("binary_data_output", False)
    if not isinstance(binary, bool):
        raise InputInvalid("parameter 'binary_data_output' must be a boolean")
    req.binary_output = binary
    for key in sorted(params):
        if key in UNSUPPORTED or key.startswith("triton_"):
            raise InputInvalid(f"parameter {key[:64]!r} is not supported by inferq")
    req.parameters = params


def _inputs(
    value: object, binary: memoryview, settings: Settings, max_tensors: int
) -> list[Tensor]:
    if not isinstance(value, list) or not value:
        raise InputInvalid("inputs must be a non-empty list of tensors")
    if len(value) > max_tensors:  # counted before any is decoded
        raise InputInvalid(
            f"the request has {len(value)} inputs; inferq takes {max_tensors} per request "
            f"(a job takes one input kind): {quote_names(value)}"
        )
    tensors: list[Tensor] = []
    at = 0  # where the next input's binary data starts
    items = 0
    for spec in value:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InputInvalid("each input must be an object with a string 'name'")
        name = spec["name"][:64]
        datatype = check_datatype(name, spec.get("datatype"))
        shape = check_shape(name, spec.get("shape"), settings.max_body_bytes)
        items += _check_limits(name, datatype, shape, settings)
        if items > settings.max_inputs_per_job:
            raise InputTooLarge(
                f"input '{name}': {items} job inputs (elements, or rows of a tensor) exceed "
                f"INFERQ_MAX_INPUTS_PER_JOB={settings.max_inputs_per_job}"
            )
        tensor, at = _data(name, datatype, shape, spec, binary, at)
        tensors.append(tensor)
    if at != len(binary):
        raise InputInvalid(
            f"the inputs' binary_data_size add up to {at} bytes, but {len(binary)} bytes follow "
            f"the JSON header: {len(binary) - at} left over"
        )
    return tensors


def _check_limits(name: str, datatype: str, shape: tuple[int, ...], settings: Settings) -> int:
    """The job inputs a tensor makes (a BYTES element, or a row of a numeric tensor), after
    checking a row against INFERQ_MAX_TENSOR_BYTES."""
    if datatype == BYTES:
        return math.prod(shape)
    row = byte_size(datatype, shape[1:]) or 0
    if row > settings.max_tensor_bytes:
        raise InputTooLarge(
            f"input '{name}': a row of {datatype} {list(shape[1:])} is {row} bytes, over "
            f"INFERQ_MAX_TENSOR_BYTES={settings.max_tensor_bytes}"
        )
    return shape[0] if shape else 1


def _data(
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    spec: dict[str, Any],
    binary: memoryview,
    at: int,
) -> tuple[Tensor, int]:
    """The input's tensor, from its JSON `data` or its slice of the binary data at `at`;
    and where the next input's binary data starts."""
    params = _object(spec.get("parameters"), f"input '{name}' parameters")
    if any(k.startswith("shared_memory") for k in params):
        raise InputInvalid(f"input '{name}': shared memory is not supported; send the data")
    size = params.get("binary_data_size")
    if size is None:
        if "data" not in spec:
            raise InputInvalid(f"input '{name}' has neither data nor parameters.binary_data_size")
        return from_json(name, datatype, shape, spec["data"]), at
    if "data" in spec:
        raise InputInvalid(f"input '{name}' has both data and parameters.binary_data_size")
    if type(size) is not int or size < 0:
        raise InputInvalid(f"input '{name}': binary_data_size must be a non-negative integer")
    if at + size > len(binary):
        raise InputInvalid(
            f"input '{name}': binary_data_size {size} starts at byte {at} of the binary data, "
            f"which has {len(binary)} bytes"
        )
    return from_binary(name, datatype, shape, binary[at : at + size]), at + size


def _outputs(doc: dict[str, Any], max_tensors: int) -> list[Output] | None:
    value = doc.get("outputs")
    if value is None:
        return None
    if not isinstance(value, list):
        raise InputInvalid("outputs must be a list")
    if len(value) > max_tensors:  # counted before any is looked at
        raise InputInvalid(
            f"an inferq model gives one output; the request names {len(value)}: "
            f"{quote_names(value)}"
        )
    out = []
    for spec in value:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InputInvalid("each output must be an object with a string 'name'")
        name = spec["name"][:64]
        params = _object(spec.get("parameters"), f"output '{name}' parameters")
        if any(k.startswith("shared_memory") for k in params):
            raise InputInvalid(f"output '{name}': shared memory is not supported")
        binary = params.get("binary_data")
        k = params.get("classification", 0)
        if (binary is not None and not isinstance(binary, bool)) or type(k) is not int or k < 0:
            raise InputInvalid(
                f"output '{name}': binary_data must be a boolean, classification an integer ≥ 0"
            )
        out.append(Output(name, binary, k))
    return out


# --- the request as a job ---
def submission(
    req: OipRequest,
    model: str,
    info: ModelInfo | None,
    tenant: str,
    idempotency_key: str | None,
) -> Submission:
    """The job an infer request asks `model` for (its input and outputs checked against what
    the model declares: `oip_metadata`)."""
    kinds = input_kinds(info)
    if len(req.inputs) != 1:  # `parse_infer` refuses more; this guards a request built by hand
        raise InputInvalid(
            f"inferq takes one input tensor per request, not {len(req.inputs)}: "
            f"{quote_names([{'name': t.name} for t in req.inputs])}"
        )
    (tensor,) = req.inputs
    kind = kinds.get(tensor.name)
    if kind is None:
        raise InputInvalid(
            f"model {model!r} has no input '{tensor.name}'; it takes: {', '.join(kinds)}"
        )
    name = output_name(info)
    for o in req.outputs or ():
        if o.name != name:
            raise InputInvalid(f"model {model!r} has no output '{o.name}'; it gives: {name}")
    parameters = dict(req.parameters)
    k = req.output(name).classification
    if k and output_kind(info) == OutputKind.LABELS and info and "top_k" in info.parameters:
        parameters.setdefault("top_k", k)
    sub = Submission(
        model=model,
        tenant=tenant,
        priority=req.priority,
        timeout_s=req.timeout_s,
        idempotency_key=idempotency_key,
        parameters=parameters,
    )
    if kind == InputKind.IMAGE:
        sub.files = images(tensor)
    elif kind == InputKind.TEXT:
        sub.items = list(texts(tensor))
    else:
        sub.items = list(tensors(tensor))
    return sub


def _bytes_input(tensor: Tensor, what: str) -> list[Any]:
    if tensor.datatype != BYTES or not isinstance(tensor.values, list):
        raise InputInvalid(f"input '{tensor.name}' must be BYTES ({what}), not {tensor.datatype}")
    return tensor.values


def texts(tensor: Tensor) -> list[str]:
    """A BYTES tensor's elements as texts (UTF-8)."""
    out = []
    for i, v in enumerate(_bytes_input(tensor, "one text per element")):
        try:
            out.append(v if isinstance(v, str) else str(v, "utf-8"))
        except UnicodeDecodeError as e:
            raise InputInvalid(f"input '{tensor.name}': element {i} is not UTF-8 ({e})") from e
    return out


def images(tensor: Tensor) -> list[bytes]:
    """A BYTES tensor's elements as encoded image files (JSON carries them as base64)."""
    out = []
    for i, v in enumerate(_bytes_input(tensor, "one encoded image per element")):
        if not isinstance(v, str):
            out.append(bytes(v))  # the one copy, out of the request body
            continue
        try:
            out.append(base64.b64decode(v, validate=True))
        except (binascii.Error, ValueError) as e:
            raise InputInvalid(
                f"input '{tensor.name}': element {i} is not base64 (JSON carries images as "
                f"base64; binary data carries their bytes) ({e})"
            ) from e
    return out


def tensors(tensor: Tensor) -> list[InputItem]:
    """A numeric tensor of shape [n, ...] as n tensor inputs of shape [...]."""
    dtype = TENSOR_DTYPES.get(tensor.datatype)
    if dtype is None or tensor.datatype not in NUMERIC:
        raise InputInvalid(
            f"input '{tensor.name}': inferq tensors are not {tensor.datatype}; use one of "
            f"{sorted(TENSOR_DTYPES)}"
        )
    if not tensor.shape:
        raise InputInvalid(f"input '{tensor.name}': a tensor input needs a batch dimension")
    # A row goes in as an array, not as base64 or nested lists: `core.decode` takes it as
    # it is (np.asarray of an array of its dtype is the array) and copies it once, into the
    # job's bytes. `model_construct` because the documented model says str | list.
    return [
        TensorItem.model_construct(
            tensor=TensorSpec.model_construct(dtype=dtype, shape=list(row.shape), data=row)
        )
        for row in tensor.values
    ]
