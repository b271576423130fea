"""One dead target must not delay everyone's webhooks: real API and worker processes, a
tarpit on 127.0.0.1 (accepts connections, reads, never answers) and a live receiver.

300 jobs ask for a webhook to the tarpit, then one for the live receiver. Without per-target
limits, the 300 hold every delivery slot for a whole attempt timeout each, in turns (300 / 16
slots × 2 s ≈ 40 s before the live one's turn); with them, the tarpit holds at most
INFERQ_WEBHOOK_PER_TARGET attempts (until its circuit opens: then none), everything else of
its is deferred, and the live delivery goes out at once.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from inferq.shared import keys
from inferq.shared.jobs import decode_job
from tests.integration.receivers import HookServer
from tests.integration.stack import Stack, wait_for

TARPIT_JOBS = 300
PER_TARGET = 4
LIVE_WITHIN_S = 3.0
SETTINGS = {
    "webhook_secret": "whsec-fairness",
    "webhook_allow": "127.0.0.1",
    "webhook_timeout_s": 2,
    "webhook_concurrency": 16,
    "webhook_per_target": PER_TARGET,
}


class Tarpit:
    """Accepts every connection and reads what it is sent, never answering; counts the
    connections open at once (a sender that gives up closes its own)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.lock = threading.Lock()
        self.accepted = self.open = self.max_open = 0
        self.conns: list[socket.socket] = []
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                if self.closing:  # accepted as `close` ran: it is not in `conns` to close
                    conn.close()
                    return
                self.accepted += 1
                self.open += 1
                self.max_open = max(self.max_open, self.open)
                self.conns.append(conn)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        try:
            while conn.recv(65536):  # b"": the sender gave up and closed
                pass
        except OSError:
            pass
        with self.lock:
            self.open -= 1

    def close(self) -> None:
        with self.lock:  # every connection is in `conns` (closed here) or sees `closing`
            self.closing = True
            for conn in self.conns:
                conn.close()
        self.sock.close()


class Live:
    """Answers 204 and notes when each job's delivery arrived (wall clock, seconds)."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.hook = HookServer(self._answer)

    def _answer(self, path: str, headers: dict[str, str], body: bytes) -> int:
        self.arrived.setdefault(json.loads(body)["id"], time.time())
        return 204

    @property
    def url(self) -> str:
        return self.hook.url()

    def close(self) -> None:
        self.hook.close()


@pytest.fixture
def tarpit() -> Iterator[Tarpit]:
    t = Tarpit()
    yield t
    t.close()  # before the stack stops: its API's attempts end at once


@pytest.fixture
def live() -> Iterator[Live]:
    r = Live()
    yield r
    r.close()


def _submit(client: httpx.Client, base: str, url: str) -> str:
    r = client.post(f"{base}/v1/jobs", json={"input": "x", "webhook": {"url": url}})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def live_delay_s(stack: Stack, tarpit: Tarpit, live: Live, **settings: object) -> float:
    """Seconds from the live job's end to its delivery's arrival, behind TARPIT_JOBS
    deliveries to the tarpit."""
    stack.worker()
    base = stack.api(**SETTINGS | settings)
    with httpx.Client(timeout=10) as client, ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: _submit(client, base, tarpit.url), range(TARPIT_JOBS)))
        wait_for(lambda: tarpit.accepted >= PER_TARGET, 30, "the tarpit to hold attempts")
        job_id = _submit(client, base, live.url)
    arrived = wait_for(lambda: live.arrived.get(job_id), 90, "the live delivery")
    finished_ms = decode_job(stack.r.hgetall(keys.job(job_id))).finished_ms
    assert finished_ms is not None
    return float(arrived - finished_ms / 1000)


@pytest.mark.timeout(180)
def test_a_tarpit_target_does_not_delay_another_targets_delivery(
    stack: Stack, tarpit: Tarpit, live: Live
) -> None:
    delay_s = live_delay_s(stack, tarpit, live)
    seen = f"tarpit: {tarpit.accepted} connections, at most {tarpit.max_open} at once"
    print(f"live delivery {delay_s:.2f}s after its job ended; {seen}")
    assert delay_s <= LIVE_WITHIN_S, f"the live delivery came {delay_s:.1f}s after its job ended"
    assert tarpit.max_open <= PER_TARGET  # the tarpit never held more than its share
