"""Markers by directory: tests/unit → unit, tests/integration → integration."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(ROOT).parts
        if parts and parts[0] in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, parts[0]))
