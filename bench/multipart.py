"""`multipart/form-data` request bodies for the load generators, built before the clock starts.

One body per image, encoded once: the load generator then only writes bytes, so an upload
costs it no more than a JSON request does. The layout is what a browser or `httpx` sends for
a FastAPI `files: list[UploadFile]` route: a part per file named `files` with its filename
and type, then plain form fields (e.g. `model`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from inferq.bench.http import Body


@dataclass(frozen=True, slots=True)
class FilePart:
    filename: str
    content_type: str
    data: bytes


def boundary_for(files: Sequence[FilePart]) -> str:
    """A boundary derived from the content (so bodies are reproducible) that none of it holds."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.data)
    return f"inferq-bench-{h.hexdigest()[:40]}"


def _quoted(value: str) -> str:
    # Header parameter values: the few characters that would end or break the quoted string.
    if any(c in value for c in '"\r\n\\'):
        raise ValueError(f"multipart name or filename with a quote or line break: {value!r}")
    return value


def encode(files: Sequence[FilePart], fields: Mapping[str, str] | None = None) -> Body:
    """A multipart body: each file as a part named `files`, then `fields` as form fields."""
    boundary = boundary_for(files)
    dash = f"--{boundary}".encode()
    chunks: list[bytes] = []
    for f in files:
        if dash in f.data:
            raise ValueError(f"boundary {boundary!r} occurs inside {f.filename!r}")
        chunks += [
            dash,
            b'\r\nContent-Disposition: form-data; name="files"; filename="%s"\r\n'
            % _quoted(f.filename).encode(),
            b"Content-Type: %s\r\n\r\n" % f.content_type.encode(),
            f.data,
            b"\r\n",
        ]
    for name, value in (fields or {}).items():
        chunks += [
            dash,
            b'\r\nContent-Disposition: form-data; name="%s"\r\n\r\n' % _quoted(name).encode(),
            value.encode(),
            b"\r\n",
        ]
    chunks.append(dash + b"--\r\n")
    return Body(b"".join(chunks), f"multipart/form-data; boundary={boundary}")
