"""JSON out with orjson: numpy outputs serialise natively (~40× faster than stdlib json); and
msgpack out, with numpy arrays as packed little-endian bytes, for a job record whose client
asked for it (`Accept: application/msgpack`)."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import orjson
from fastapi.responses import JSONResponse
from starlette.responses import Response

from inferq.api.protocols import Answer


class FastJSON(JSONResponse):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def list_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's list object around one page of `data`."""
    return {
        "object": "list",
        "data": data,
        "has_more": has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


MSGPACK = "application/msgpack"
_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack")
_JSON_TYPES = ("application/json", "application/*", "*/*")


def _quality(params: str) -> float:
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return min(max(float(value), 0.0), 1.0)
            except ValueError:
                return 0.0  # an unreadable weight does not count as asking
    return 1.0


def wants_msgpack(accept: bytes | str | None) -> bool:
    """Whether an `Accept` header asks for msgpack: it names application/msgpack (or
    application/x-msgpack) with a q above 0 and no lower than any JSON type it names
    (application/json, application/*, */*). No header, or any other, keeps JSON.

    Cheap when it does not: a lower-casing and a substring test, all the hot path pays."""
    if not accept:
        return False
    # Media types are case-insensitive (RFC 9110): lower-cased once, a short header.
    text = (accept.decode("latin-1") if isinstance(accept, bytes) else accept).lower()
    if "msgpack" not in text:
        return False
    packed = plain = 0.0
    for part in text.split(","):
        media, _, params = part.partition(";")
        media = media.strip()
        if media in _MSGPACK_TYPES:
            packed = max(packed, _quality(params))
        elif media in _JSON_TYPES:
            plain = max(plain, _quality(params))
    return packed > 0 and packed >= plain


def _packed_array(value: Any) -> Any:
    # msgpack calls this for what it cannot pack itself: numpy arrays and numpy scalars.
    if isinstance(value, np.ndarray):
        little = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
        return {"dtype": value.dtype.name, "shape": list(value.shape), "data": little.tobytes()}
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot encode a {type(value).__name__} as msgpack")


class Msgpack(Response):
    """A record in msgpack, as the JSON answer would carry it, except that each numpy array
    is a map `{"dtype", "shape", "data"}`: its little-endian bytes, not a list of numbers."""

    media_type = MSGPACK

    def render(self, content: Any) -> bytes:
        return msgpack.packb(content, default=_packed_array, use_bin_type=True)


def record_response(
    content: dict[str, Any],
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    *,
    packed: bool = False,
) -> Response:
    """A job record as its client asked (`wants_msgpack`): msgpack for a 2xx answer, JSON
    otherwise; an error body is always JSON, whatever was asked."""
    if packed and 200 <= status_code < 300:
        return Msgpack(content, status_code=status_code, headers=headers)
    return FastJSON(content, status_code=status_code, headers=headers)


def answer_response(answer: Answer, *, packed: bool = False) -> Response:
    """A protocol adapter's answer as HTTP, a job record as its client asked (`record_response`)."""
    return record_response(answer.body, answer.status, answer.headers, packed=packed)
