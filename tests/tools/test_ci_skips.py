"""Under CI=true a skip is a failure: a missing dependency can never pass CI silently."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import pytest
maybe = pytest.importorskip("no_such_module_anywhere")

def test_never_runs():
    pass
"""
INNER = """
import pytest

def test_skips_inside():
    pytest.importorskip("no_such_module_anywhere")

@pytest.mark.xfail(reason="expected")
def test_xfail_is_not_a_skip():
    raise AssertionError
"""
CONFTEST = "from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport\n"


@pytest.mark.parametrize(("ci", "failed"), [("true", True), ("", False)])
def test_skips_fail_only_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str, failed: bool
) -> None:
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_module_skip=SUITE, test_inner_skip=INNER)
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--continue-on-collection-errors"
    )
    outcomes = result.parseoutcomes()
    if failed:
        assert (
            outcomes.get("failed", 0) == 1 and outcomes.get("errors", outcomes.get("error", 0)) == 1
        )
        assert "skips are failures in CI" in result.stdout.str()
    else:
        assert outcomes.get("skipped") == 2 and "failed" not in outcomes
    assert outcomes.get("xfailed") == 1
