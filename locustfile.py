"""Load test: users submitting small batches of texts (the seed article's scenario).

Two ways in, weighted 3:1: `POST /v1/infer` (submit and wait), and `POST /v1/jobs`
followed by a long-poll `GET /v1/jobs/{id}?wait=30`. Run against a running stack:

    locust -f locustfile.py --host http://127.0.0.1:8000 \
        --users 64 --spawn-rate 8 --run-time 2m --headless

Environment: INFERQ_LOCUST_MODEL (default: the server's default model),
INFERQ_LOCUST_API_KEY (sent as `Authorization: Bearer ...` when set),
INFERQ_LOCUST_MAX_INPUTS (inputs per request, 1..N, default 8).
"""

from __future__ import annotations

import os
import random

from locust import HttpUser, between, task

_SENTENCE = (
    "the queue keeps the device busy while the api stays thin and every batch is bounded "
    "by padded tokens so memory never runs out when many users send many short texts"
)
WORDS = _SENTENCE.split()
MODEL = os.environ.get("INFERQ_LOCUST_MODEL") or None
API_KEY = os.environ.get("INFERQ_LOCUST_API_KEY")
MAX_INPUTS = int(os.environ.get("INFERQ_LOCUST_MAX_INPUTS", "8"))
WAIT_S = 30


def texts() -> list[str]:
    """A small batch: 1..MAX_INPUTS sentences of 3..40 words."""
    return [
        " ".join(random.choices(WORDS, k=random.randint(3, 40)))
        for _ in range(random.randint(1, MAX_INPUTS))
    ]


class InferqUser(HttpUser):
    wait_time = between(0.05, 0.5)

    def on_start(self) -> None:
        if API_KEY:
            self.client.headers["Authorization"] = f"Bearer {API_KEY}"

    def _body(self) -> dict[str, object]:
        body: dict[str, object] = {"inputs": texts()}
        if MODEL:
            body["model"] = MODEL
        return body

    @task(3)
    def infer(self) -> None:
        body = self._body() | {"wait": WAIT_S}
        with self.client.post("/v1/infer", json=body, catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"{r.status_code}: {r.text[:200]}")
            elif r.json().get("status") != "succeeded":
                r.failure(f"job {r.json().get('status')}")

    @task(1)
    def submit_then_wait(self) -> None:
        with self.client.post("/v1/jobs", json=self._body(), catch_response=True) as r:
            if r.status_code != 202:
                r.failure(f"{r.status_code}: {r.text[:200]}")
                return
            job_id = r.json()["id"]
        with self.client.get(
            f"/v1/jobs/{job_id}",
            params={"wait": WAIT_S},
            name="/v1/jobs/[id]?wait",
            catch_response=True,
        ) as r:
            if r.status_code != 200 or r.json().get("status") != "succeeded":
                r.failure(f"{r.status_code}: {r.text[:200]}")
