"""A minimal HTTP/1.1 keep-alive client for the load generators, on asyncio streams.

Why not httpx: on the 2-core box its pure-Python request path cost ~4 ms of CPU per request
(the load generator at ~40 % of a core for 93 requests/s), CPU the systems under test then
lack; this client costs ~0.2 ms (2 %), the same for every system measured. It does only what
the bench needs: bodies built beforehand (JSON, or multipart for image uploads) sent with their
content type, `Content-Length` responses (uvicorn, which serves every system
here, always sends one), one request at a time per connection.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CLOSE = re.compile(rb"\r\nconnection:[ \t]*close", re.IGNORECASE)
MAX_HEAD = 64 * 1024
JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Body:
    """One request's body, built before the clock starts, the `Content-Type` it goes with, and
    the answer it asks for (`accept`: None sends no `Accept` header)."""

    data: bytes
    content_type: str = JSON
    accept: str | None = None


class HTTPError(Exception):
    """The server's answer could not be read as an HTTP/1.1 response with a length."""


class Connection:
    """One keep-alive connection to `base` (http://host:port); reconnects after an error."""

    def __init__(self, base: str, timeout_s: float = 60.0) -> None:
        parts = urlsplit(base)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"expected http://host:port, got {base!r}")
        self.host, self.port, self.timeout_s = parts.hostname, parts.port, timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        content_type: str = JSON,
        accept: str | None = None,
    ) -> tuple[int, bytes]:
        """(status, body). Raises OSError, HTTPError or TimeoutError; the connection is then
        dropped, so the next request starts on a fresh one."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._request(method, path, body, content_type, accept)
        except BaseException:
            self.close()
            raise

    async def _request(
        self, method: str, path: str, body: bytes, content_type: str, accept: str | None
    ) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            + (f"accept: {accept}\r\n\r\n" if accept else "\r\n")
        )
        self._writer.write(head.encode() + body)
        try:
            raw = await self._reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            raise HTTPError(f"no complete response head: {e}") from e
        if len(raw) > MAX_HEAD or not raw.startswith(b"HTTP/1.1 "):
            raise HTTPError(f"not an HTTP/1.1 response: {raw[:40]!r}")
        length = _LENGTH.search(raw)
        if length is None:
            raise HTTPError("response without Content-Length")
        try:
            data = await self._reader.readexactly(int(length.group(1)))
        except asyncio.IncompleteReadError as e:
            raise HTTPError("response body cut short") from e
        if _CLOSE.search(raw):
            self.close()
        return int(raw[9:12]), data

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
