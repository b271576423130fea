"""The edges a public deployment meets first, against a real API process on a real Redis:
one request must not stall the event loop for everyone nor grow the process without bound.

Bench-style checks: the API's /healthz is probed from another thread while the request is
in flight, and the process's peak RSS is read from /proc. The bounds are generous (a slow
CI box must not fail them); what they catch is the difference between a refusal before
parsing (milliseconds, megabytes) and a parse of everything (seconds, gigabytes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import orjson

from tests.integration.stack import Stack

STALL_BOUND_S = 1.0
GROWTH_BOUND_BYTES = 300 * 2**20


def _status_kb(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {name} for pid {pid}")


def reset_peak(pid: int) -> None:
    """Start VmHWM over from the current RSS (writing 5 to clear_refs), where allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # then the peak is the process's whole life: the bound still holds or not


@dataclass
class Probe:
    """The slowest /healthz answer seen while it ran, and how many it got."""

    worst_s: float = 0.0
    answered: int = 0
    errors: list[str] = field(default_factory=list)


@contextmanager
def probing(base: str) -> Iterator[Probe]:
    probe = Probe()
    stop = threading.Event()

    def run() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    client.get(f"{base}/healthz").raise_for_status()
                except httpx.HTTPError as e:
                    probe.errors.append(repr(e))
                probe.worst_s = max(probe.worst_s, time.perf_counter() - t0)
                probe.answered += 1
                stop.wait(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield probe
    finally:
        stop.set()
        thread.join(15)


def measure(
    stack: Stack, base: str, send: Callable[[], httpx.Response]
) -> tuple[httpx.Response, Probe, int]:
    """(the response, the /healthz probe during it, the API's peak RSS growth in bytes)."""
    pid = stack.procs[-1].pid
    reset_peak(pid)
    before = _status_kb(pid, "VmRSS") * 1024
    with probing(base) as probe:
        time.sleep(0.1)  # the probe is running before the request goes out
        response = send()
        time.sleep(0.1)
    grown = _status_kb(pid, "VmHWM") * 1024 - before
    return response, probe, grown


def test_a_30_mb_json_tensor_neither_stalls_nor_bloats_the_api(stack: Stack) -> None:
    base = stack.api()
    rows, cols = 1000, 7500  # 7.5 M values, ~30 MB of JSON as nested lists
    body = orjson.dumps(
        {
            "input": {
                "tensor": {"dtype": "float32", "shape": [rows, cols], "data": [[1.5] * cols] * rows}
            }
        }
    )
    assert len(body) > 30_000_000

    def send() -> httpx.Response:
        return httpx.post(
            f"{base}/v1/jobs",
            content=body,
            headers={"content-type": "application/json"},
            timeout=60,
        )

    r, probe, grown = measure(stack, base, send)
    assert r.status_code == 413 and "INFERQ_MAX_JSON_VALUES" in r.json()["error"]["message"]
    assert probe.answered > 0 and not probe.errors, probe.errors
    assert probe.worst_s < STALL_BOUND_S, f"/healthz stalled {probe.worst_s:.2f}s"
    assert grown < GROWTH_BOUND_BYTES, f"the API grew {grown / 2**20:.0f} MB"


def test_a_tensor_just_under_the_budget_is_accepted_without_stalling(stack: Stack) -> None:
    """The budget's default still lets a sizeable nested-list tensor through (no worker is
    needed: the job is only queued), and parsing it stays well under the stall bound."""
    base = stack.api()
    rows, cols = 500, 1000  # 0.5 M values: half the default INFERQ_MAX_JSON_VALUES
    body = orjson.dumps(
        {
            "input": {
                "tensor": {
                    "dtype": "float32",
                    "shape": [rows, cols],
                    "data": [[0.25] * cols] * rows,
                }
            }
        }
    )

    def send() -> httpx.Response:
        return httpx.post(
            f"{base}/v1/jobs",
            content=body,
            headers={"content-type": "application/json"},
            timeout=60,
        )

    r, probe, grown = measure(stack, base, send)
    assert r.status_code == 202, r.text
    assert probe.worst_s < STALL_BOUND_S, f"/healthz stalled {probe.worst_s:.2f}s"
    assert grown < GROWTH_BOUND_BYTES, f"the API grew {grown / 2**20:.0f} MB"
