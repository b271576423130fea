"""`inferq api`: serve the HTTP front end with uvicorn (no --reload: it forks).

Every response carries `X-Inferq-Api`: a random id of the process that answered, logged at
start, so with several API processes behind one port (`inferq up --apis N`) or a load
balancer one can tell which served a request.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import secrets
import socket
import sys
from types import FrameType

import uvicorn
from fastapi import FastAPI

from inferq.api.app import create_app
from inferq.shared.logs import setup_logging
from inferq.shared.settings import Settings


class _Server(uvicorn.Server):
    """On SIGTERM/SIGINT, open long-polls answer with the current state before uvicorn
    waits for in-flight requests, so shutdown never cuts a waiting client off."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        parts = getattr(self._app.state, "parts", None)  # None before the app has started
        if parts is not None:
            parts.jobs.shutdown()
        super().handle_exit(sig, frame)


def _http_protocol() -> type[asyncio.Protocol] | str:
    """httptools (C) with one send an answer when installed, as the api extra does; else
    uvicorn's choice (h11)."""
    if importlib.util.find_spec("httptools") is None:
        return "auto"
    from inferq.api.one_write import OneWriteHttpTools

    return OneWriteHttpTools


def main(settings: Settings, host: str, port: int, fd: int | None = None) -> int:
    """Serve on host:port, or on the inherited listening socket `fd` (`inferq up`)."""
    setup_logging(settings.log_level, settings.log_format)
    try:
        app = create_app(settings)
    except (ValueError, OSError) as e:  # e.g. INFERQ_API_KEYS malformed or its file missing
        print("inferq: invalid configuration:", e, file=sys.stderr)
        return 2
    instance = secrets.token_hex(4)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
        timeout_keep_alive=max(1, round(settings.keepalive_s)),
        http=_http_protocol(),
        log_level=logging.getLevelName(logging.getLogger().level).lower(),
        headers=[("X-Inferq-Api", instance)],
    )
    logging.getLogger("inferq.api").info("api process %s (pid %d)", instance, os.getpid())
    # An inherited socket is shared with the other API processes: the kernel gives each new
    # connection to one of them. (socket() with a fileno detects its family itself.)
    sockets = None if fd is None else [socket.socket(fileno=fd)]
    _Server(config, app).run(sockets=sockets)
    return 0
