"""`inferq submit` / `inferq get` as functions: one JSON document out, an exit status back."""

from __future__ import annotations

import json

import httpx
import pytest

from inferq.client.cli import get_command, submit_command
from tests.unit.client.fakes import FakeAPI, error, job, reply

VECTOR = [2.0, 11.0, 4854149.0, 1.0]


def test_submit_prints_the_queued_job(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeAPI([reply(202, job("j1", "queued"))])
    code = submit_command(
        ["hello world"],
        url="http://x",
        model="echo",
        priority="high",
        transport=httpx.MockTransport(api),
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["id"] == "j1"
    assert api.seen[0].path == "/v1/jobs"
    assert api.seen[0].body == {"inputs": ["hello world"], "model": "echo", "priority": "high"}


def test_submit_with_wait_prints_the_final_job(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeAPI([reply(200, job("j1", outputs=[VECTOR]))])
    code = submit_command(
        ["hello world"], url="http://x", wait=True, api_key="k", transport=httpx.MockTransport(api)
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["outputs"] == [VECTOR]
    assert api.seen[0].path == "/v1/infer" and api.seen[0].headers["authorization"] == "Bearer k"


def test_a_failed_job_is_printed_with_status_1(capsys: pytest.CaptureFixture[str]) -> None:
    failed = job("j2", "failed", error={"code": "model_error", "message": "boom"})
    code = submit_command(
        ["x"],
        url="http://x",
        wait=True,
        transport=httpx.MockTransport(FakeAPI([reply(422, failed)])),
    )
    assert code == 1
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "model_error"


def test_get_prints_the_job_and_an_error_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeAPI(
        [reply(200, job("j3", outputs=[VECTOR])), error(404, "not_found", "no job 'nope'")]
    )
    assert get_command("j3", url="http://x", transport=httpx.MockTransport(api)) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "j3"
    assert get_command("nope", url="http://x", transport=httpx.MockTransport(api)) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert json.loads(out.err) == {
        "error": {"status": 404, "code": "not_found", "message": "no job 'nope'"}
    }


def test_get_with_wait_long_polls(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeAPI([reply(200, job("j4", outputs=[VECTOR]))])
    assert get_command("j4", url="http://x", wait_s=5, transport=httpx.MockTransport(api)) == 0
    assert api.seen[0].params == {"wait": "5.000"}
    assert json.loads(capsys.readouterr().out)["status"] == "succeeded"
