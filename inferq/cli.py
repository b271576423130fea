"""`inferq`: `up` (everything on one machine), `api`, `worker`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inferq", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="Redis (unless INFERQ_REDIS_URL is set) + one worker + the API")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--model", default=None, help="model to serve (default INFERQ_MODEL)")

    api = sub.add_parser("api", help="the HTTP front end against INFERQ_REDIS_URL")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8000)

    worker = sub.add_parser("worker", help="one device-owning worker against INFERQ_REDIS_URL")
    worker.add_argument("--model", default=None, help="model to serve (default INFERQ_MODEL)")
    # These two parse their own options (`inferq bench --help`, `inferq calibrate --help`).
    sub.add_parser(
        "bench", help="measure inferq against the alternatives (see bench/)", add_help=False
    )
    sub.add_parser("calibrate", help="measure memory per padded token on a device", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args, rest = _parser().parse_known_args(argv)
    if rest and args.command not in ("bench", "calibrate"):
        _parser().error(f"unrecognized arguments: {' '.join(rest)}")
    from inferq.shared.settings import Settings

    try:
        settings = Settings()
    except ValidationError as e:
        print("inferq: invalid configuration:", e, sep="\n", file=sys.stderr)
        return 2
    if args.command == "bench":
        from inferq.bench.main import main as bench_main

        return bench_main(rest)
    if args.command == "calibrate":
        from inferq.worker.calibrate import main as calibrate_main

        return calibrate_main(settings, rest)
    if args.command == "api":
        from inferq.api.main import main as api_main

        return api_main(settings, args.host, args.port)
    if args.command == "worker":
        from inferq.worker.main import main as worker_main

        return worker_main(settings, args.model)
    from inferq.up import run_up

    explicit_redis = "INFERQ_REDIS_URL" in os.environ
    return run_up(
        host=args.host,
        port=args.port,
        model=args.model,
        data_dir=Path(settings.data_dir),
        redis_url=settings.redis_url.get_secret_value() if explicit_redis else None,
    )


if __name__ == "__main__":
    sys.exit(main())
