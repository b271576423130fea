"""The status page in a real headless Chromium against a running stack.

Skipped only when Chromium is absent outside CI (`.ci/run` installs Debian's
`chromium`). The screenshot lands in `test-artifacts/status.png`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.stack import ROOT, Stack, wait_for

ARTIFACTS = ROOT / "test-artifacts"
CHARTS = ("queue", "items", "batch")


@pytest.fixture
def chromium() -> str:
    from tests.integration.browser import find_chromium

    binary = find_chromium()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but chromium is missing (apt-get install chromium)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return binary


@pytest.fixture
def load(stack: Stack) -> Iterator[str]:
    """A slow echo worker, an API, and a client thread keeping a few jobs queued."""
    stack.worker(worker_id="status-w1", echo_batch_delay_ms=40, max_batch_size=8)
    base = stack.api()
    stop = threading.Event()

    def submit() -> None:
        with httpx.Client(base_url=base, timeout=10) as c:
            n = 0
            while not stop.is_set():
                texts = [f"text {n} " + "word " * (i % 7) for i in range(6)]
                c.post("/v1/infer", json={"inputs": texts, "wait": 5})
                n += 1

    def long_jobs() -> None:  # 25 batches each: running for a second, progress moving
        with httpx.Client(base_url=base, timeout=10) as c:
            while not stop.is_set():
                c.post("/v1/infer", json={"inputs": [f"part {i}" for i in range(200)], "wait": 10})

    threads = [threading.Thread(target=submit, daemon=True) for _ in range(4)]
    threads.append(threading.Thread(target=long_jobs, daemon=True))
    for t in threads:
        t.start()
    yield base
    stop.set()
    for t in threads:
        t.join(15)


def test_status_page_draws_live_charts(chromium: str, load: str, tmp_path: Path) -> None:
    from tests.integration.browser import Browser

    browser = Browser(chromium, f"{load}/status")
    try:

        def points() -> dict[str, int] | None:
            # Before the page has loaded the document is about:blank: no charts yet.
            got = browser.evaluate(
                "(() => { const rows = document.getElementById('workers');"
                " if (!rows) return null;"
                " const out = {rows: +rows.dataset.rows};"
                " for (const e of document.querySelectorAll('svg.chart'))"
                "   out[e.dataset.chart] = +e.dataset.points;"
                " return out; })()"
            )
            ready = got and got["rows"] >= 1 and all(got.get(c, 0) >= 8 for c in CHARTS)
            return got if ready else None

        got = wait_for(points, 60, "the status page charts to show data", 0.25)
        assert got is not None
        assert browser.evaluate("document.getElementById('overall').dataset.status") == "ok"
        assert "status-w1" in browser.evaluate("document.getElementById('workers').textContent")

        def progress() -> str | None:  # a running job's row: "<done> / 200 (<pct> %)"
            text = browser.evaluate("document.getElementById('running').textContent")
            return text if isinstance(text, str) and " / 200 (" in text else None

        assert wait_for(progress, 30, "a running job's progress on the page", 0.25)
        shot = browser.screenshot(ARTIFACTS / "status.png")
        assert shot.stat().st_size > 10_000
    except BaseException:
        print(browser.log())
        raise
    finally:
        browser.close()
