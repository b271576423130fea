"""Body size limits as raw ASGI middleware: refuse before a large body is buffered.

`BodyLimit` applies `INFERQ_MAX_BODY_BYTES`; `UploadLimit`, the one the app installs, gives
POST /v1/files its own, `INFERQ_MAX_BATCH_FILE_BYTES` plus multipart framing.
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferq.api.core.errors import error_body
from inferq.api.responses import FastJSON


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    @staticmethod
    def reject(max_body_bytes: int) -> FastJSON:
        return FastJSON(
            error_body(
                "body_too_large",
                f"request body exceeds INFERQ_MAX_BODY_BYTES={max_body_bytes} bytes",
            ),
            status_code=413,
        )

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = self.reject(self.max_body_bytes)
        if scope.get("path", "").startswith("/v2/"):
            # The Open Inference Protocol's error shape is a string: its clients read that.
            message = orjson.loads(response.body)["error"]["message"]
            response = FastJSON({"error": message}, status_code=413)
        await response(scope, receive, send)

    def _declared_too_big(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    return int(value) > self.max_body_bytes
                except ValueError:
                    return False  # not a number: the server refuses it before us
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._declared_too_big(scope):
            await self._refuse(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(scope, receive, send)


#: Multipart boundaries, part headers and the purpose field around an uploaded file.
FRAMING_BYTES = 64 * 1024


class _UploadBodyLimit(BodyLimit):
    @staticmethod
    def reject(max_body_bytes: int) -> FastJSON:
        limit = max_body_bytes - FRAMING_BYTES
        return FastJSON(
            error_body(
                "body_too_large", f"upload exceeds INFERQ_MAX_BATCH_FILE_BYTES={limit} bytes"
            ),
            status_code=413,
        )


class UploadLimit:
    """The app's body limit, by route: POST /v1/files may carry a file of up to
    `max_file_bytes` (plus multipart framing), everything else `max_body_bytes`. Both
    refuse before the body is buffered."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_file_bytes: int) -> None:
        self.default = BodyLimit(app, max_body_bytes)
        self.upload = _UploadBodyLimit(app, max_file_bytes + FRAMING_BYTES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upload = (
            scope["type"] == "http"
            and scope.get("method") == "POST"
            and scope.get("path", "").rstrip("/") == "/v1/files"
        )
        await (self.upload if upload else self.default)(scope, receive, send)
