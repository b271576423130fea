"""The one app fixture of the API's unit tests: the real app (`create_app`) on fakeredis,
through its Redis seam (`create_app(settings, redis=...)`), no monkeypatching."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import fakeredis
import pytest
from fastapi.testclient import TestClient

from inferq.api.app import create_app
from inferq.shared.settings import Settings


@dataclass
class App:
    client: TestClient
    redis: fakeredis.FakeAsyncRedis  # the app's own client (its event loop is the app's)
    server: fakeredis.FakeServer  # for a client of the test's own: FakeRedis(server=...)


MakeApp = Callable[..., App]


@pytest.fixture
def make_app() -> Iterator[MakeApp]:
    """`make_app(**settings)`: the app started (lifespan run) on an empty fakeredis; settings
    default to the echo model."""
    with ExitStack() as stack:

        def make(**overrides: Any) -> App:
            server = fakeredis.FakeServer()
            redis = fakeredis.FakeAsyncRedis(server=server)
            settings = Settings(**({"model": "echo"} | overrides))
            client = stack.enter_context(TestClient(create_app(settings, redis=redis)))
            return App(client, redis, server)

        yield make
