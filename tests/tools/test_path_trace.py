"""`scripts/path_trace.py`'s reading of a `redis-cli monitor` trace: which hop each command
falls in (the numbers in docs/benchmarks.md's path table come from it)."""

from __future__ import annotations

import hashlib

from inferq.shared import lua
from inferq.shared.lua import queue as scripts
from tests.tools.scripts import load_script

pt = load_script("path_trace")


def _sha(name: str) -> str:
    return hashlib.sha1(lua.source(getattr(scripts, name)).encode()).hexdigest()


def test_monitor_lines_name_scripts_by_their_sha() -> None:
    text = (
        b"OK\n"
        b'100.000100 [0 127.0.0.1:5000] "EVALSHA" "' + _sha("SUBMIT").encode() + b'" "4" "k"\n'
        b'100.000200 [0 lua] "XADD" "s" "*" "job" "x"\n'
        b'100.000300 [0 127.0.0.1:5001] "evalsha" "ffff" "1"\n'
    )
    assert pt.parse_monitor(text, pt.script_names()) == [
        (100.0001, "127.0.0.1:5000", "SUBMIT"),
        (100.0002, "lua", "XADD"),
        (100.0003, "127.0.0.1:5001", "EVALSHA?"),
    ]


def test_commands_go_to_the_request_in_flight_and_hops_end_at_landmarks() -> None:
    a, b = pt.Request(10.0, 10.010), pt.Request(10.020, 10.030)
    monitored = [
        (9.999, "api", "HGETALL"),  # before any request: dropped
        (10.001, "api", "SUBMIT"),
        (10.0015, "lua", "XADD"),
        (10.003, "worker", "CLAIM"),
        (10.004, "worker", "XREADGROUP"),
        (10.006, "worker", "FINISH"),
        (10.015, "worker", "XREADGROUP"),  # between requests: dropped
        (10.021, "api", "SUBMIT"),
    ]
    pt.assign([a, b], monitored)
    hops = [(name, round(s * 1e6), cmds) for name, s, cmds in a.hops()]
    assert hops == [
        ("client → SUBMIT", 1000, ["SUBMIT"]),
        ("SUBMIT → CLAIM", 2000, ["XADD", "CLAIM"]),
        ("CLAIM → FINISH", 3000, ["XREADGROUP", "FINISH"]),
        ("FINISH → client", 4000, []),
    ]
    assert [name for name, _, _ in b.hops()] == ["client → SUBMIT", "SUBMIT → client"]
    table = pt.table([a])
    assert "| CLAIM → FINISH | 1 | 3000 |" in table and "| **total** | 1 | 10000 |" in table
