"""Per-request overhead of /v2/models/echo/infer beside /v1/infer: echo model, one client,
sequential, httpx keep-alive. Run from the repo root: .venv/bin/python scripts/oip_overhead.py"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

sys.path.insert(0, ".")
from inferq.redis_server import RedisServer
from tests.integration.stack import Stack

N, WARM, ROUNDS = 300, 50, 3
TEXT = "hello world"


def bodies() -> dict[str, tuple[str, bytes, dict[str, str]]]:
    raw = len(TEXT).to_bytes(4, "little") + TEXT.encode()
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    js = orjson.dumps(
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXT]}]}
    )
    ctype = {"content-type": "application/json"}
    return {
        "/v1/infer (JSON)": ("/v1/infer", orjson.dumps({"inputs": [TEXT]}), ctype),
        "/v2 infer (JSON)": ("/v2/models/echo/infer", js, ctype),
        "/v2 infer (binary)": (
            "/v2/models/echo/infer",
            header + raw,
            {"Inference-Header-Content-Length": str(len(header))},
        ),
    }


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    server = RedisServer(tmp / "redis", appendonly=True)
    server.start()
    stack = Stack(server.url, tmp)
    try:
        stack.worker()
        base = stack.api(log_level="WARNING")
        cases = bodies()
        lat: dict[str, list[float]] = {k: [] for k in cases}
        with httpx.Client(base_url=base, timeout=10) as c:
            for path, body, headers in cases.values():
                for _ in range(WARM):
                    assert c.post(path, content=body, headers=headers).status_code == 200
            for _ in range(N):  # interleaved request by request: load drift hits all alike
                for name, (path, body, headers) in cases.items():
                    t = time.perf_counter()
                    r = c.post(path, content=body, headers=headers)
                    lat[name].append((time.perf_counter() - t) * 1000)
                    assert r.status_code == 200, r.text
        for name, xs in lat.items():
            q = np.percentile(xs, [50, 90])
            print(
                f"{name:22s} n={len(xs)} median={q[0]:.2f} ms p90={q[1]:.2f} ms mean={statistics.mean(xs):.2f} ms"
            )
    finally:
        stack.close()
        server.stop()


if __name__ == "__main__":
    main()
