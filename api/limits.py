"""Body size limit as raw ASGI middleware: refuse before a large body is buffered."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferq.api.responses import FastJSON, error_body


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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_body_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    await self.reject(self.max_body_bytes)(scope, receive, send)
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
                await self.reject(self.max_body_bytes)(scope, receive, send)
