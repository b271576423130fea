"""Batch input lines → requests, and finished requests → output and error lines.

Pure: no Redis, no HTTP, no clock (but `Endpoint.bind`, which reads a model's declaration
through the catalog it is given). An input file is JSONL, one request per non-blank line:

    {"custom_id": "a1", "method": "POST", "url": "/v1/embeddings", "body": {...}}

Lines are numbered by their position in the file (1-based, blank lines counted but never
requests), and that number is a line's identity everywhere: results in Redis, job
idempotency keys, the `id` of its output line.

- The whole file is checked when the batch is created (`check_file`), line by line and
  lazily (no object per line is built, and the count stops at the limit): too many
  requests → 422 naming `INFERQ_MAX_BATCH_LINES`; no request, or two lines with the same
  `custom_id` → 422 (a batch with ambiguous ids is refused, as OpenAI does). A line over the
  JSON value budget (`INFERQ_MAX_JSON_VALUES`) is never parsed. Nothing else refuses a batch.
- One line is checked when the runner reaches it (`envelope`): over the value budget, not
  JSON, not an object, no string `custom_id`, `method` other than POST, `url` other than
  the batch's endpoint, `body` not an object → that line alone goes to the error file
  (`LineError`).
- The body is then read exactly as the endpoint reads a request body (`Endpoint.parse`),
  submitted as the endpoint submits it, and answered as the endpoint answers: a batch line
  records the very status and body the endpoint would have sent.

Output line (a 2xx answer): `{"id", "custom_id", "response": {"status_code", "request_id",
"body"}, "error": null}`. Error line: the same with `error: {"code", "message"}`, and
`response` null when no request could be made (a malformed line, a cancelled or expired
batch) or the endpoint's 4xx answer otherwise.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import orjson

from inferq.api.core.decode import json_values
from inferq.api.protocols import Adapter, Answer
from inferq.api.protocols.embeddings import Embeddings
from inferq.api.protocols.v1 import Infer
from inferq.shared.errors import InputInvalid

#: Kinds of results in `batch_results`: the first byte of each stored value.
OK, ERROR = b"o", b"e"


@dataclass(frozen=True, slots=True)
class Line:
    number: int  # 1-based position in the file
    raw: bytes


class LineError(Exception):
    """A line that cannot become a request; it goes to the error file as `code`."""

    def __init__(self, code: str, message: str, custom_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.custom_id = custom_id


@dataclass(frozen=True, slots=True)
class Envelope:
    custom_id: str
    body: bytes  # the body as JSON, parsed by the endpoint exactly as an HTTP body


# A line's first non-blank byte and the rest of its line: blank lines (whitespace only,
# however many) are skipped inside the regex engine, never one Python step each.
_REQUEST = re.compile(rb"\S[^\n]*")


def iter_lines(content: bytes) -> Iterator[Line]:
    """The file's requests, lazily: every non-blank line (leading blanks kept), numbered by
    position. Nothing is built for a line before it is asked for."""
    number, at = 1, 0  # `at`: where the line numbered `number` starts
    for m in _REQUEST.finditer(content):
        start = content.rfind(b"\n", at, m.start()) + 1
        number += content.count(b"\n", at, start)
        at = start
        yield Line(number, content[start : m.end()])


def split_lines(content: bytes) -> list[Line]:
    """Every request of a file already checked (`check_file` bounds how many there are)."""
    return list(iter_lines(content))


def _custom_id(obj: object) -> str | None:
    cid = obj.get("custom_id") if isinstance(obj, dict) else None
    return cid if isinstance(cid, str) and cid else None


def envelope(line: Line, endpoint: str, max_values: int | None = None) -> Envelope:
    """The line's custom_id and body; `LineError` naming what is wrong with it."""
    if max_values is not None and (n := json_values(line.raw)) > max_values:
        raise LineError(
            "too_large",
            f"line {line.number} holds about {n} JSON values, over INFERQ_MAX_JSON_VALUES="
            f"{max_values}",
        )
    try:
        obj = orjson.loads(line.raw)
    except orjson.JSONDecodeError as e:
        raise LineError("invalid_json", f"line {line.number} is not JSON: {e}") from e
    if not isinstance(obj, dict):
        raise LineError("invalid_request", f"line {line.number} is not a JSON object")
    cid = _custom_id(obj)
    if cid is None:
        raise LineError("missing_custom_id", f"line {line.number} has no string 'custom_id'", None)
    method = obj.get("method")
    if method != "POST":
        raise LineError(
            "invalid_method",
            f"line {line.number}: method {method!r}; only 'POST' is supported",
            cid,
        )
    url = obj.get("url")
    if url != endpoint:
        raise LineError(
            "invalid_url",
            f"line {line.number}: url {url!r} is not the batch's endpoint {endpoint!r}",
            cid,
        )
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_request", f"line {line.number}: 'body' is not a JSON object", cid)
    return Envelope(cid, orjson.dumps(body))


def check_file(content: bytes, max_lines: int, max_values: int) -> int:
    """The number of requests in an input file; refuses a file no batch can run. Reads at
    most `max_lines` + 1 requests, and parses none over `max_values` JSON values."""
    seen: dict[str, int] = {}
    count = 0
    duplicate: str | None = None  # the first found; the line limit is checked all the same
    for line in iter_lines(content):
        count += 1
        if count > max_lines:
            raise InputInvalid(
                f"the file has more than {max_lines} requests (INFERQ_MAX_BATCH_LINES={max_lines})"
            )
        cid = _custom_id_of_raw(line.raw, max_values)
        if cid is None or duplicate is not None:
            continue  # its own error line, later; or a refusal is already due
        if cid in seen:
            duplicate = (
                f"custom_id {cid[:64]!r} is on lines {seen[cid]} and {line.number}: "
                "each request needs its own"
            )
        seen[cid] = line.number
    if not count:
        raise InputInvalid("the input file holds no requests (one JSON object per line)")
    if duplicate is not None:
        raise InputInvalid(duplicate)
    return count


def _custom_id_of_raw(raw: bytes, max_values: int) -> str | None:
    if json_values(raw) > max_values:
        return None  # never parsed: the runner records it as too large
    try:
        return _custom_id(orjson.loads(raw))
    except orjson.JSONDecodeError:
        return None


# --- what each endpoint does with a body: its protocol's adapter ---

ENDPOINTS: Mapping[str, Adapter] = {"/v1/embeddings": Embeddings(), "/v1/infer": Infer()}


# --- output and error lines ---


def request_id(batch_id: str, number: int) -> str:
    """The output line's `id`: derived, so writing a line twice writes the same bytes."""
    digest = hashlib.sha256(f"{batch_id}:{number}".encode()).hexdigest()[:32]
    return f"batch_req_{digest}"


def _dumps(obj: object) -> bytes:
    # The routes' own serialiser (FastJSON): numpy rows come out exactly as they would there.
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def result_line(
    batch_id: str, number: int, custom_id: str, answer: Answer, job_id: str | None
) -> tuple[bytes, bytes]:
    """(kind, line) for an answer the endpoint gave: OK for a 2xx, ERROR otherwise."""
    ok = 200 <= answer.status < 300
    error = None
    if not ok:
        err = answer.body.get("error")
        err = err if isinstance(err, dict) else {}
        error = {
            "code": str(err.get("code") or answer.status),
            "message": str(err.get("message") or f"HTTP {answer.status}"),
        }
    line = {
        "id": request_id(batch_id, number),
        "custom_id": custom_id,
        "response": {"status_code": answer.status, "request_id": job_id, "body": answer.body},
        "error": error,
    }
    return (OK if ok else ERROR), _dumps(line)


def error_line(
    batch_id: str, number: int, custom_id: str | None, code: str, message: str
) -> tuple[bytes, bytes]:
    """(ERROR, line) for a line no request was made for, or none finished."""
    line = {
        "id": request_id(batch_id, number),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
    return ERROR, _dumps(line)


def custom_id_of(line: Line, max_values: int) -> str | None:
    """Best effort, for the error line of a line that did not parse as a request; a line
    over the value budget is not parsed for it either."""
    return _custom_id_of_raw(line.raw, max_values)
