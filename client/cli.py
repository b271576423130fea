"""`inferq submit` and `inferq get`, as plain functions over `Client` (the typer app in
`inferq/cli.py` parses the options and calls these).

Each prints one JSON document and returns the exit status: the job on stdout (0; 1 when a
waited job ended without success), or `{"error": {"status", "code", "message"}}` on stderr
(1) when the call failed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from inferq.client.errors import APIError, InferqError, JobFailed, WaitTimeout
from inferq.client.jobs import Job
from inferq.client.sync import Client
from inferq.client.wire import Priority

DEFAULT_URL = "http://127.0.0.1:8000"


def _print(doc: dict[str, Any], *, err: bool = False) -> None:
    print(json.dumps(doc), file=sys.stderr if err else sys.stdout)


def _report(call: Callable[[], Job]) -> int:
    """Run `call` and print its job or its error."""
    try:
        _print(call().to_dict())
        return 0
    except JobFailed as e:
        _print(e.job.to_dict())
        return 1
    except WaitTimeout as e:  # still running: its current state is the answer
        _print(e.job.to_dict())
        return 0
    except APIError as e:
        _print({"error": {"status": e.status, "code": e.code, "message": e.message}}, err=True)
        return 1
    except InferqError as e:
        _print({"error": {"status": None, "code": type(e).__name__, "message": str(e)}}, err=True)
        return 1


def submit_command(
    texts: Sequence[str],
    *,
    url: str = DEFAULT_URL,
    api_key: str | None = None,
    model: str | None = None,
    priority: Priority | None = None,
    timeout_s: float | None = None,
    wait: bool = False,
    idempotency_key: str | None = None,
    transport: httpx.BaseTransport | None = None,
) -> int:
    """Submit `texts` as one job and print it (queued); with `wait`, print it once final."""
    with Client(url, api_key=api_key, transport=transport) as client:
        send = client.infer if wait else client.submit
        return _report(
            lambda: send(
                list(texts),
                model=model,
                priority=priority,
                timeout_s=timeout_s,
                idempotency_key=idempotency_key,
            )
        )


def get_command(
    job_id: str,
    *,
    url: str = DEFAULT_URL,
    api_key: str | None = None,
    wait_s: float = 0.0,
    transport: httpx.BaseTransport | None = None,
) -> int:
    """Print a job; with `wait_s`, once it is final or when `wait_s` has passed."""
    with Client(url, api_key=api_key, transport=transport) as client:
        if wait_s > 0:
            return _report(lambda: client.wait(job_id, timeout_s=wait_s))
        return _report(lambda: client.get(job_id))
