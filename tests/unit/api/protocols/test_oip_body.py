"""Compressed /v2 bodies (issue 28, item 2): inflated in bounded steps against one budget of
bytes in flight per process; past it 429, a bomb 413 — before it costs memory."""

from __future__ import annotations

import gzip
import threading
import time
import zlib

import numpy as np
import orjson
import pytest

from inferq.api.parts import parts_of
from inferq.api.protocols.oip.body import MAX_INFLATE_RATIO, BodyBudget, inflate
from inferq.shared.errors import InputInvalid, InputTooLarge, Overloaded
from tests.unit.api.conftest import MakeApp

MiB = 1 << 20


def test_a_hold_covers_what_it_is_asked_and_gives_it_back() -> None:
    budget = BodyBudget(10 * MiB)
    with budget.hold() as a, budget.hold() as b:
        a.cover(4 * MiB)
        a.cover(3 * MiB)  # covered already: nothing more taken
        b.cover(6 * MiB)
        assert budget.held_bytes == 10 * MiB
        with pytest.raises(Overloaded) as e:
            budget.hold().cover(1)
        assert e.value.retry_after_s >= 1 and budget.refused == 1
        with pytest.raises(InputTooLarge, match="whole budget"):
            budget.hold().cover(11 * MiB)  # can never fit: 413, not 429
    assert budget.held_bytes == 0 and budget.peak_bytes == 10 * MiB
    with pytest.raises(Overloaded, match="ended"):  # released: a late step of its thread stops
        a.cover(5 * MiB)


def _low_entropy(n_bytes: int, seed: int) -> bytes:
    """FP32 data that gzips about 9:1: under the ratio bound, far from random."""
    values = np.random.default_rng(seed).integers(0, 4, n_bytes // 4).astype(np.float32)
    return values.tobytes()


def test_concurrent_gzipped_bodies_stay_under_the_budget() -> None:
    """16 threads inflate 4 MiB bodies at once against a budget of four: the budget is never
    exceeded (its own peak, and each accepted body's bytes are real), every refusal is the
    429 kind, and everything is given back."""
    body = _low_entropy(4 * MiB, 0)
    packed = gzip.compress(body, 1)
    budget = BodyBudget(4 * (4 * MiB + len(packed)))
    start = threading.Barrier(16)
    outcomes: list[object] = []

    def one() -> None:
        start.wait()
        with budget.hold() as hold:
            try:
                hold.cover(len(packed))  # the compressed body, as the route holds it on arrival
                out = inflate(packed, "gzip", 8 * MiB, hold)
            except Overloaded as e:
                outcomes.append(e)
                return
            assert budget.held_bytes <= budget.capacity_bytes
            outcomes.append(out == body)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(outcomes) == 16
    refused = [o for o in outcomes if isinstance(o, Overloaded)]
    assert all(o is True for o in outcomes if not isinstance(o, Overloaded))
    assert refused and len(refused) == budget.refused and len(refused) < 16
    assert all(r.reason == "body_budget" and r.retry_after_s >= 1 for r in refused)
    assert budget.peak_bytes <= budget.capacity_bytes
    assert budget.held_bytes == 0


def test_a_bomb_is_refused_within_a_few_steps() -> None:
    """64 MiB of zeros in 64 KB: refused by its ratio after ~2 MiB inflated, in milliseconds,
    well under INFERQ_MAX_BODY_BYTES; what it reserved is given back."""
    bomb = zlib.compress(bytes(64 * MiB), 9)
    gz = gzip.compress(bytes(64 * MiB), 9)
    budget = BodyBudget(256 * MiB)
    for encoding, packed in (("deflate", bomb), ("gzip", gz)):
        t0 = time.perf_counter()
        with budget.hold() as hold, pytest.raises(InputTooLarge, match=f"{MAX_INFLATE_RATIO}:1"):
            inflate(packed, encoding, 128 * MiB, hold)
        assert time.perf_counter() - t0 < 0.5
    assert budget.held_bytes == 0
    # A body the ratio allows but the size does not: INFERQ_MAX_BODY_BYTES names it.
    with pytest.raises(InputTooLarge, match="INFERQ_MAX_BODY_BYTES=2097152"):
        inflate(gzip.compress(_low_entropy(4 * MiB, 1), 1), "gzip", 2 * MiB)


def test_small_bodies_inflate_freely_and_truncation_is_still_a_400() -> None:
    small = b'{"inputs": []}' * 1000  # 14 KB inflating ~300:1: under the ratio's floor
    assert inflate(gzip.compress(small), "gzip", MiB) == small
    with pytest.raises(InputInvalid, match="truncated gzip"):
        inflate(gzip.compress(_low_entropy(MiB, 2))[:-100], "gzip", 2 * MiB)


def _gzipped_infer(n_bytes: int) -> tuple[bytes, dict[str, str]]:
    values = _low_entropy(n_bytes, 3)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "tensor",
                    "datatype": "FP32",
                    "shape": [1, n_bytes // 4],
                    "parameters": {"binary_data_size": n_bytes},
                }
            ]
        }
    )
    headers = {
        "content-encoding": "gzip",
        "inference-header-content-length": str(len(header)),
        "content-type": "application/octet-stream",
    }
    return gzip.compress(header + values, 1), headers


def test_the_route_answers_a_full_budget_429_and_a_bomb_413(make_app: MakeApp) -> None:
    """In the protocol's error shape: 429 + Retry-After while the process's bodies in flight
    are at the budget; 413 for a bomb; each leaves the budget as it found it."""
    c = make_app(max_body_bytes=4 * MiB).client
    url = "/v2/models/echo/infer"
    bomb = gzip.compress(bytes(4 * MiB), 9)
    r = c.post(url, content=bomb, headers={"content-encoding": "gzip"})
    assert r.status_code == 413 and f"{MAX_INFLATE_RATIO}:1" in r.json()["error"], r.text
    budget: BodyBudget = parts_of(c.app.state).oip_bodies  # type: ignore[attr-defined]
    assert budget.capacity_bytes == 16 * MiB and budget.held_bytes == 0
    packed, headers = _gzipped_infer(2 * MiB)
    with budget.hold() as others:
        others.cover(15 * MiB)  # other requests' bodies in flight
        r = c.post(url, content=packed, headers=headers)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
        assert "budget" in r.json()["error"]
        assert budget.held_bytes == 15 * MiB
    assert budget.held_bytes == 0
