"""Markers by directory (tests/unit → unit, tests/integration → integration, tests/tools →
tools: checks of the benchmark, docs, deploy files and the code's shape), and under
`CI=true` no silent skips: a test or module that skips (a missing dependency, a missing
binary) fails instead, so a broken install can never pass CI by running less."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(ROOT).parts
        if parts and parts[0] in ("unit", "integration", "tools"):
            item.add_marker(getattr(pytest.mark, parts[0]))


def _fail_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true (skips are failures in CI): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    rep = outcome.get_result()
    _fail_skip(rep)
    setattr(item, f"rep_{rep.when}", rep)
