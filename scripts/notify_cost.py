"""What a completion message costs an API process that hears it, in CPU.

A `Notifier` runs in a child process against a redis-server started here; this process
publishes `--messages` completion messages (a finished one-input minilm record, the size
FINISH sends) and reads the child's CPU from /proc around them. Two kinds, alternated in
rounds: messages addressed to the child (`keys.done_channel(id, its listener)`: what every
API process paid for every job while each subscribed to all completions), and messages
addressed to another API process (what each pays now for a job it does not wait on). Each
round ends with one message for a job the child watches, so the reading waits until the
child has handled everything before it.

Run: .venv/bin/python scripts/notify_cost.py [--messages 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import msgpack
import numpy as np
import redis
from stack_cpu import cpu_s

from inferq.redis_server import RedisServer
from inferq.shared import keys
from inferq.shared.jobs import Job, Status, encode_final, encode_submit
from inferq.shared.schema import JobField

CHILD = """
import asyncio, sys
from redis.asyncio import Redis
from inferq.shared.producer import Notifier

async def main() -> None:
    n = Notifier(Redis.from_url(sys.argv[1]))
    await n.start()
    await n.connected.wait()
    print(n.listener, flush=True)
    loop = asyncio.get_running_loop()
    while job_id := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        fut = n.watch(job_id)
        print("ready", flush=True)
        await fut
        print("done", flush=True)

asyncio.run(main())
"""


def message() -> bytes:
    """A finished one-input minilm record as FINISH publishes it (inputs left out)."""
    job = Job(id="{minilm.0}.0123456789abcdef", model="minilm", inputs=["a short sentence"])
    fields = encode_submit(job) | encode_final(
        Status.SUCCEEDED, finished_ms=1, outputs=np.ones((1, 384), np.float32), worker="w"
    )
    fields.pop(JobField.INPUTS)
    return msgpack.packb([x for kv in fields.items() for x in kv])


def round_us(
    r: redis.Redis, child: subprocess.Popen[str], listener: str, to: str, n: int, end: str
) -> float:
    """µs of the child's CPU per message: `n` messages addressed to listener `to`, then one
    to the child's own `listener` for the job `end` it watches."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(end + "\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "ready"
    payload = message()
    before = cpu_s(child.pid)
    p = r.pipeline(transaction=False)
    for i in range(n):
        p.publish(keys.done_channel(f"{{minilm.0}}.{i:016x}", to), payload)
        if len(p) == 500:
            p.execute()
    p.execute()
    r.publish(keys.done_channel(end, listener), payload)
    assert child.stdout.readline().strip() == "done"
    return (cpu_s(child.pid) - before) / n * 1e6


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, server.url], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert child.stdout is not None
            listener = child.stdout.readline().strip()
            r = redis.Redis.from_url(server.url)
            got: dict[str, list[float]] = {"to this process": [], "to another process": []}
            for k in range(args.rounds):
                for kind, to in (("to this process", listener), ("to another process", "other")):
                    got[kind].append(round_us(r, child, listener, to, args.messages, f"e{k}{to}"))
            print(f"{len(message())} B a message, {args.messages} a round, {args.rounds} rounds")
            print("| messages | child's CPU µs a message, rounds | median |\n|---|---|---|")
            for kind, xs in got.items():
                print(
                    f"| {kind} | {', '.join(f'{x:.2f}' for x in xs)} | {statistics.median(xs):.2f} |"
                )
        finally:
            child.kill()
            server.stop()
