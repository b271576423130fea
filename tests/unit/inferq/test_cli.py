"""The command line: help without valid settings, plain configuration errors, options that
are settings validated by Settings itself."""

from __future__ import annotations

import pytest

from inferq import cli

COMMANDS = ["up", "api", "worker", "calibrate", "bench"]


@pytest.mark.parametrize("argv", [["--help"], *[[c, "--help"] for c in COMMANDS]])
def test_help_works_without_valid_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    monkeypatch.setenv("INFERQ_MAX_BATCH_SIZE", "-3")  # would fail Settings()
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "Usage: inferq" in out
    if argv[0] in COMMANDS:
        assert f"inferq {argv[0]}" in out


def test_setting_options_carry_the_settings_own_description(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    assert cli.main(["calibrate", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "INFERQ_BACKEND" in out and "INFERQ_DEVICE" in out and "--onnx-variant" in out


def test_invalid_settings_give_a_plain_message_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INFERQ_MAX_BATCH_SIZE", "-3")
    assert cli.main(["worker"]) == 2
    err = capsys.readouterr().err
    assert "invalid configuration" in err and "max_batch_size" in err and "Traceback" not in err
    monkeypatch.delenv("INFERQ_MAX_BATCH_SIZE")
    assert cli.main(["calibrate", "--backend", "tensorflow"]) == 2
    assert "backend" in capsys.readouterr().err


def test_unknown_commands_and_options_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["nope"]) == 2
    assert cli.main(["worker", "--nope"]) == 2
    assert cli.main(["bench", "--env", "NOEQUALS", "--systems", "seed"]) == 2
