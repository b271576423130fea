"""`inferq api`: serve the HTTP front end with uvicorn (no --reload: it forks)."""

from __future__ import annotations

import logging

import uvicorn

from api.app import create_app
from shared.logs import setup_logging
from shared.settings import Settings


def main(settings: Settings, host: str, port: int) -> int:
    setup_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
        log_level=logging.getLevelName(logging.getLogger().level).lower(),
    )
    return 0
