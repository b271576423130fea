"""Headless Chromium driven over the DevTools protocol: just enough to test a page.

`Browser(url)` starts Debian's `chromium` on a free debugging port with a throwaway
profile; `evaluate(js)` runs an expression in the page; `screenshot(path)` saves a PNG.
No Selenium or Playwright: one websocket, a few CDP commands.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from inferq.redis_server import free_port

CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    """The Chromium binary, or None: `INFERQ_TEST_CHROMIUM` first, then the usual names."""
    for name in (os.environ.get("INFERQ_TEST_CHROMIUM"), *CANDIDATES):
        if name and (path := shutil.which(name)):
            return path
    return None


class Browser:
    def __init__(self, binary: str, url: str, *, width: int = 1200, height: int = 900) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="inferq-chromium-")
        port = free_port()
        self._log = open(Path(self._profile.name) / "chromium.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--no-default-browser-check",
                "--hide-scrollbars",
                f"--window-size={width},{height}",
                f"--user-data-dir={self._profile.name}",
                f"--remote-debugging-port={port}",
                "--remote-allow-origins=*",
                url,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Its own process group: Chromium's helpers (zygote, renderer, utility) outlive a
            # terminated main process for a moment and keep writing to the profile.
            start_new_session=True,
        )
        self._ids = itertools.count(1)
        self._exit = contextlib.ExitStack()
        self._ws = self._exit.enter_context(
            connect(self._page_ws(port, url), max_size=64 * 1024 * 1024)
        )
        # Pin the viewport: --window-size includes no browser chrome in headless, but the
        # screenshot should not depend on the Chromium version's idea of it either.
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def _page_ws(self, port: int, url: str, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited ({self.proc.returncode}): {self.log()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=1) as r:
                    targets = json.load(r)
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no chromium page target after {timeout_s}s: {self.log()}")
            time.sleep(0.1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one CDP command and return its result (events in between are skipped)."""
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._ws.recv(timeout=30))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def log(self) -> str:
        try:
            return (Path(self._profile.name) / "chromium.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def close(self) -> None:
        try:
            self._exit.close()
        finally:
            self._stop_group()
            self._log.close()
            self._profile.cleanup()  # only once no Chromium process can still write to it

    def _stop_group(self) -> None:
        """Stop Chromium and every helper it started; return once none is left."""
        for sig, grace_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                self.proc.poll()  # reap the main process; helpers are reaped by init
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.05)
