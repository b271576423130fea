"""A webhook receiver on 127.0.0.1 for the integration tests: one HTTP server a test gives its
own answer to, so each test says only how its receiver behaves."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: (path, headers, body) → the status to answer; 0 sends nothing (a receiver that hangs).
Answer = Callable[[str, dict[str, str], bytes], int]


class HookServer:
    def __init__(self, answer: Answer) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                if len(body) < length:
                    # The sender died mid-request (a test SIGKILLs an API while it retries):
                    # a real receiver never hands a cut-off body to its application.
                    self.close_connection = True
                    return
                status = answer(self.path, dict(self.headers.items()), body)
                if status:
                    self.send_response(status)
                    self.send_header("content-length", "0")
                    self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
