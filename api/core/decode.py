"""The JSON routes' request bodies, decoded by compiled code: orjson, then explicit checks.

`/v1/jobs`, `/v1/infer` and `/v1/embeddings` are the hot routes: a quiet request spends more
CPU building and validating pydantic models than on anything it does. These functions take
exactly what the strict pydantic models (`core.schemas.SubmitRequest`, `InferRequest`; and
`protocols.embeddings.EmbeddingsRequest`, decoded there with these helpers) take — which is exactly what the OpenAPI document says —
and `tests/unit/api/core/test_decode.py` holds the two to the same answers on generated
bodies, valid and not. The models stay the documentation (and the multipart path's).

A refusal is `InvalidBody`: the route answers it as a pydantic failure would be (422,
`invalid_request`, each problem with its location), or in OpenAI's shape (400) on
`/v1/embeddings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from inferq.api.core.inputs import ImageItem, InputItem, TensorItem, TensorSpec, check_json_budget
from inferq.shared.errors import InputInvalid, InputTooLarge
from inferq.shared.schema import LANES, WEBHOOK_EVENTS, Lane
from inferq.shared.settings import Settings

MAX_TIMEOUT_S = 86_400
#: The body of a JSON route that takes no inputs (POST /v1/batches: ids, an endpoint, a window,
#: at most 16 short metadata pairs) fits in this many bytes. The routes that take inputs are
#: bounded by INFERQ_MAX_BODY_BYTES (`middleware`) instead; both by INFERQ_MAX_JSON_VALUES.
MAX_CONTROL_JSON_BYTES = 64 * 1024
MAX_URL = 2048
_SUBMIT = frozenset(
    (
        "inputs",
        "input",
        "model",
        "priority",
        "timeout_s",
        "parameters",
        "webhook",
        "metadata",
        "result_ttl_s",
    )
)
#: A job's `metadata`: OpenAI's bounds for the same field (16 pairs, 64-character keys,
#: 512-character values), so a label set made for one fits the other.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
_INFER = _SUBMIT | {"wait"}


class InvalidBody(InputInvalid):
    """A body that does not decode: `detail` lists each problem as {loc, msg}."""

    def __init__(self, loc: str, msg: str) -> None:
        super().__init__(f"{loc}: {msg}")
        self.detail = [{"loc": loc, "msg": msg}]


@dataclass(slots=True)
class JobBody:
    """A decoded `/v1/jobs` or `/v1/infer` body."""

    items: list[InputItem]
    model: str | None = None
    priority: Lane = Lane.NORMAL
    timeout_s: float | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    webhook: str | None = None
    webhook_events: tuple[str, ...] | None = None  # None: every final status
    metadata: dict[str, str] = field(default_factory=dict)
    result_ttl_s: int | None = None
    wait: float | None = None


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidBody("body", f"JSON decode error: {e}") from e
    if not isinstance(value, dict):
        raise InvalidBody("body", "Input should be an object")
    return value


def json_budget(raw: bytes, settings: Settings, max_bytes: int) -> dict[str, Any]:
    """A JSON route's body, within the one JSON budget: at most `max_bytes` and
    INFERQ_MAX_JSON_VALUES values (413 past either, checked before parsing), then an object."""
    if len(raw) > max_bytes:
        raise InputTooLarge(f"the JSON body is over {max_bytes} bytes ({len(raw)})")
    check_json_budget(raw, settings)
    return json_object(raw)


def number(value: Any, loc: str, *, gt: float | None = None, ge: float | None = None) -> float:
    # A JSON number, never a bool (a bool is an int to Python) nor a numeric string.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidBody(loc, "Input should be a valid number")
    number = float(value)
    if gt is not None and not number > gt:
        raise InvalidBody(loc, f"Input should be greater than {gt:g}")
    if ge is not None and not number >= ge:
        raise InvalidBody(loc, f"Input should be greater than or equal to {ge:g}")
    return number


def optional_str(value: Any, loc: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidBody(loc, "Input should be a valid string")
    return value


def _extra(obj: dict[str, Any], allowed: frozenset[str] | set[str], loc: str) -> None:
    for key in obj:
        if key not in allowed:
            raise InvalidBody(f"{loc}{key}", "Extra inputs are not permitted")


def _tensor(value: Any, loc: str) -> TensorItem:
    if not isinstance(value, dict):
        raise InvalidBody(loc, "Input should be an object")
    _extra(value, {"dtype", "shape", "data"}, f"{loc}.")
    for name in ("dtype", "shape", "data"):
        if name not in value:
            raise InvalidBody(f"{loc}.{name}", "Field required")
    dtype, shape, data = value["dtype"], value["shape"], value["data"]
    if not isinstance(dtype, str):
        raise InvalidBody(f"{loc}.dtype", "Input should be a valid string")
    if not isinstance(shape, list) or any(
        isinstance(d, bool) or not isinstance(d, int) for d in shape
    ):
        raise InvalidBody(f"{loc}.shape", "Input should be a list of integers")
    if not isinstance(data, str | list):
        raise InvalidBody(f"{loc}.data", "Input should be a string (base64) or a list")
    spec = TensorSpec.model_construct(dtype=dtype, shape=shape, data=data)
    return TensorItem.model_construct(tensor=spec)


def _item(value: Any, loc: str) -> InputItem:
    """A string, `{"image": str}` or `{"tensor": {dtype, shape, data}}`."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        if isinstance(value.get("image"), str):
            return ImageItem.model_construct(image=value["image"])
        if "tensor" in value:
            return _tensor(value["tensor"], f"{loc}.tensor")
    raise InvalidBody(
        loc, 'an input is a string, {"image": "<base64>"} or {"tensor": {"dtype", "shape", "data"}}'
    )


def _items(body: dict[str, Any]) -> list[InputItem]:
    inputs, single = body.get("inputs"), body.get("input")
    if (inputs is None) == (single is None):
        raise InvalidBody("body", "give exactly one of 'input' (one item) or 'inputs' (a list)")
    if single is not None:
        return [_item(single, "input")]
    if not isinstance(inputs, list):
        raise InvalidBody("inputs", "Input should be a valid list")
    if not inputs:
        raise InvalidBody("body", "'inputs' is empty: give at least one")
    if set(map(type, inputs)) == {str}:  # texts alone: the list is its own answer, no call each
        return inputs
    return [_item(v, f"inputs.{i}") for i, v in enumerate(inputs)]


def _webhook(value: Any) -> tuple[str, tuple[str, ...] | None] | None:
    """(url, events) of a `webhook` object; `events` None when it names none (all of them)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidBody("webhook", "Input should be an object")
    _extra(value, {"url", "events"}, "webhook.")
    url = value.get("url")
    if not isinstance(url, str):
        raise InvalidBody(
            "webhook.url", "Field required" if url is None else "Input should be a valid string"
        )
    if len(url) > MAX_URL:
        raise InvalidBody("webhook.url", f"String should have at most {MAX_URL} characters")
    events = value.get("events")
    if events is None:
        return url, None
    if not isinstance(events, list) or not events:
        raise InvalidBody("webhook.events", "Input should be a non-empty list")
    for i, e in enumerate(events):
        if e not in WEBHOOK_EVENTS or not isinstance(e, str):
            raise InvalidBody(
                f"webhook.events.{i}", f"Input should be one of {list(WEBHOOK_EVENTS)}"
            )
    return url, tuple(sorted(set(events)))


def metadata(value: Any, loc: str = "metadata") -> dict[str, str]:
    """A job's labels: at most 16 string pairs, keys up to 64 characters, values up to 512."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidBody(loc, "Input should be a valid dictionary")
    if len(value) > MAX_METADATA_PAIRS:
        raise InvalidBody(loc, f"Dictionary should have at most {MAX_METADATA_PAIRS} items")
    for k, v in value.items():
        if len(k) > MAX_METADATA_KEY:
            raise InvalidBody(
                f"{loc}.{k[:MAX_METADATA_KEY]}",
                f"a key should have at most {MAX_METADATA_KEY} characters",
            )
        if not isinstance(v, str):
            raise InvalidBody(f"{loc}.{k}", "Input should be a valid string")
        if len(v) > MAX_METADATA_VALUE:
            raise InvalidBody(
                f"{loc}.{k}", f"String should have at most {MAX_METADATA_VALUE} characters"
            )
    return value


def job_body(raw: bytes, *, infer: bool) -> JobBody:
    """A `/v1/jobs` (`infer=False`) or `/v1/infer` body, as `SubmitRequest` / `InferRequest`
    would take it; `InvalidBody` otherwise."""
    body = json_object(raw)
    _extra(body, _INFER if infer else _SUBMIT, "")
    out = JobBody(_items(body), model=optional_str(body.get("model"), "model"))
    priority = body.get("priority", Lane.NORMAL)
    if priority not in LANES or not isinstance(priority, str):
        raise InvalidBody("priority", "Input should be 'high', 'normal' or 'low'")
    out.priority = Lane(priority)
    if (timeout := body.get("timeout_s")) is not None:
        out.timeout_s = number(timeout, "timeout_s", gt=0)
        if not out.timeout_s <= MAX_TIMEOUT_S:  # NaN too
            raise InvalidBody("timeout_s", f"Input should be less than or equal to {MAX_TIMEOUT_S}")
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidBody("parameters", "Input should be an object")
    out.parameters = parameters
    if (webhook := _webhook(body.get("webhook"))) is not None:
        out.webhook, out.webhook_events = webhook
    out.metadata = metadata(body.get("metadata"))
    if (ttl := body.get("result_ttl_s")) is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, int):
            raise InvalidBody("result_ttl_s", "Input should be a valid integer")
        if ttl <= 0:
            raise InvalidBody("result_ttl_s", "Input should be greater than 0")
        out.result_ttl_s = ttl
    if infer and (wait := body.get("wait")) is not None:
        out.wait = number(wait, "wait", ge=0)
    return out
