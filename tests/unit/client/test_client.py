"""The client's operations against a scripted API: what each sends, how it reads the answer,
long-polls, errors, and the same behaviour from `Client` and `AsyncClient`."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest

from inferq.client import (
    APIError,
    BadRequest,
    Conflict,
    Forbidden,
    InvalidResponse,
    Job,
    JobFailed,
    JobStatus,
    NotFound,
    Overloaded,
    ServerError,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from inferq.client.errors import InferqError
from tests.unit.client.fakes import (
    FakeAPI,
    FakeClock,
    async_client,
    client,
    error,
    job,
    reply,
)

VECTORS = [[2.0, 11.0, 4854149.0, 1.0], [3.0, 5.0, 3018192.0, 1.0]]


def b64(row: list[float]) -> str:
    return base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode()


# --- requests ----------------------------------------------------------------------------


def test_submit_sends_the_documented_body_and_bearer_key() -> None:
    api = FakeAPI([reply(202, job("j1", "queued"), Location="/v1/jobs/j1")])
    tensor = np.arange(4, dtype=">i4").reshape(2, 2)  # big-endian: sent little-endian
    with client(api, FakeClock(), api_key="k-123") as c:
        got = c.submit(
            ["hello", b"\x89PNG", tensor, {"image": "aGk="}],
            model="echo",
            priority="high",
            timeout_s=10,
            parameters={"top_k": 3},
            webhook="https://hooks.example/x",
        )
    assert got.status is JobStatus.QUEUED and got.id == "j1"
    (seen,) = api.seen
    assert (seen.method, seen.path) == ("POST", "/v1/jobs")
    assert seen.headers["authorization"] == "Bearer k-123"
    data = base64.b64encode(np.arange(4, dtype="<i4").tobytes()).decode()
    assert seen.body == {
        "inputs": [
            "hello",
            {"image": base64.b64encode(b"\x89PNG").decode()},
            {"tensor": {"dtype": "int32", "shape": [2, 2], "data": data}},
            {"image": "aGk="},
        ],
        "model": "echo",
        "priority": "high",
        "timeout_s": 10,
        "parameters": {"top_k": 3},
        "webhook": {"url": "https://hooks.example/x"},
    }


def test_one_input_goes_as_input_and_defaults_are_left_to_the_server() -> None:
    api = FakeAPI([reply(202, job("j1", "queued"))])
    with client(api, FakeClock()) as c:
        c.submit(input="hi")
    assert api.seen[0].body == {"input": "hi"}
    assert "authorization" not in api.seen[0].headers


@pytest.mark.parametrize(
    "args",
    [dict(), dict(inputs=["a"], input="b"), dict(inputs="abc"), dict(inputs=np.zeros(3))],
)
def test_submit_refuses_a_wrong_inputs_argument_before_sending(args: dict[str, Any]) -> None:
    api = FakeAPI()
    with client(api, FakeClock()) as c, pytest.raises(TypeError):
        c.submit(**args)
    assert api.seen == []


def test_a_tensor_dtype_the_api_does_not_take_is_refused() -> None:
    with client(FakeAPI(), FakeClock()) as c, pytest.raises(ValueError, match="complex64"):
        c.submit(input=np.zeros(2, dtype=np.complex64))


# --- job decoding ------------------------------------------------------------------------


def test_vector_outputs_become_a_float32_array() -> None:
    body = job(
        outputs=VECTORS,
        timings={"queued_ms": 4, "run_ms": 12, "total_ms": 16, "batch_size": 1, "batch_tokens": 3},
        worker="w-echo",
        something_new=True,
    )
    with client(FakeAPI([reply(200, body)]), FakeClock()) as c:
        got = c.get("j1")
    assert isinstance(got.outputs, np.ndarray)
    assert got.outputs.dtype == np.float32 and got.outputs.shape == (2, 4)
    np.testing.assert_array_equal(got.outputs, np.asarray(VECTORS, dtype=np.float32))
    assert got.timings.run_ms == 12 and got.timings.cached is False and got.worker == "w-echo"
    assert got.to_dict()["outputs"] == VECTORS


@pytest.mark.parametrize(
    "outputs",
    [
        [[{"label": "tabby", "index": 281, "score": 0.27}]],  # labels
        [[{"box": [0, 0, 1, 1], "label": "cat", "score": 0.9}]],  # boxes
        ["a generated text", "another"],  # text
        [[1.0, 2.0], [3.0]],  # ragged: not vectors
        [[True, False]],  # booleans stay booleans
        [[1.0, None]],
        [[]],
        [7, 8],
    ],
)
def test_other_outputs_stay_python_values(outputs: list[Any]) -> None:
    with client(FakeAPI([reply(200, job(outputs=outputs))]), FakeClock()) as c:
        got = c.get("j1")
    assert got.outputs == outputs


def test_a_queued_job_has_its_position_and_eta() -> None:
    body = job(status="queued", position=3, eta_ms=None)
    with client(FakeAPI([reply(200, body)]), FakeClock()) as c:
        got = c.get("j1")
    assert (got.status.is_final, got.position, got.eta_ms, got.outputs) == (False, 3, None, None)


@pytest.mark.parametrize("body", [{"id": "x"}, {"id": "x", "status": "weird"}, ["no"], None])
def test_a_body_that_is_not_a_job_view_is_an_invalid_response(body: Any) -> None:
    with client(FakeAPI([reply(200, body)]), FakeClock()) as c, pytest.raises(InvalidResponse):
        c.get("j1")


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequest),
        (401, Unauthorized),
        (403, Forbidden),
        (404, NotFound),
        (405, APIError),
        (409, Conflict),
        (413, BadRequest),
        (422, BadRequest),
        (429, Overloaded),
        (500, ServerError),
        (502, Unavailable),
        (503, Unavailable),
        (504, Unavailable),
    ],
)
def test_error_answers_map_to_one_tree(status: int, cls: type[APIError]) -> None:
    api = FakeAPI(handler=lambda r: error(status, "some_code", "what went wrong"))
    with client(api, FakeClock()) as c, pytest.raises(cls) as info:
        c.get("j1")
    assert type(info.value) is cls and isinstance(info.value, InferqError)
    assert (info.value.status, info.value.code, info.value.message) == (
        status,
        "some_code",
        "what went wrong",
    )


def test_an_error_page_that_is_not_json_keeps_its_status_and_text() -> None:
    page = httpx.Response(502, text="<html>Bad Gateway</html>")
    with (
        client(FakeAPI(handler=lambda r: page), FakeClock()) as c,
        pytest.raises(Unavailable) as info,
    ):
        c.get("j1")
    assert info.value.code == "http_502" and "Bad Gateway" in info.value.message


def test_the_job_id_is_quoted_into_the_path() -> None:
    api = FakeAPI([error(404, "not_found", "no job")])
    with client(api, FakeClock()) as c, pytest.raises(NotFound):
        c.get("a/b?c")
    assert api.seen[0].raw_path == b"/v1/jobs/a%2Fb%3Fc"


# --- infer and wait ----------------------------------------------------------------------


def test_infer_answered_200_returns_the_job() -> None:
    api = FakeAPI([reply(200, job(outputs=VECTORS))])
    with client(api, FakeClock(), long_poll_s=20) as c:
        got = c.infer(["hello world", "a b c"])
    assert got.status is JobStatus.SUCCEEDED and got.outputs is not None
    assert api.seen[0].body == {"inputs": ["hello world", "a b c"], "wait": 20}


def test_infer_answered_202_long_polls_the_job_until_final() -> None:
    api = FakeAPI(
        [
            reply(202, job("j7", "queued"), Location="/v1/jobs/j7"),
            reply(200, job("j7", "queued", position=1)),
            reply(200, job("j7", "running")),
            reply(200, job("j7", outputs=VECTORS[:1])),
        ]
    )
    with client(api, FakeClock(), long_poll_s=20) as c:
        got = c.infer(input="hello world")
    assert got.id == "j7" and got.outputs is not None and got.outputs.shape == (1, 4)
    assert api.requests() == [("POST", "/v1/infer")] + [("GET", "/v1/jobs/j7")] * 3
    assert all(s.params == {"wait": "20.000"} for s in api.seen[1:])


@pytest.mark.parametrize(
    ("status", "code"), [(422, "model_error"), (413, "too_large"), (409, "cancelled")]
)
def test_infer_of_a_job_that_failed_raises_job_failed_with_the_job(status: int, code: str) -> None:
    failed = job(
        "j2", "cancelled" if code == "cancelled" else "failed", error={"code": code, "message": "m"}
    )
    with (
        client(FakeAPI([reply(status, failed)]), FakeClock()) as c,
        pytest.raises(JobFailed) as info,
    ):
        c.infer(input="x")
    assert info.value.job.id == "j2" and info.value.code == code and info.value.message == "m"


def test_infer_refused_at_submit_raises_the_api_error() -> None:
    api = FakeAPI([error(422, "invalid_input", "input 0 is empty")])
    with client(api, FakeClock()) as c, pytest.raises(BadRequest) as info:
        c.infer(input="")
    assert info.value.code == "invalid_input"


def test_wait_gives_up_at_its_timeout_with_the_last_state_seen() -> None:
    clock = FakeClock()

    def slow(request: httpx.Request) -> httpx.Response:
        clock.now += float(request.url.params["wait"])  # the server held it that long
        return reply(200, job("j3", "running"))

    api = FakeAPI(handler=slow)
    with client(api, clock, long_poll_s=4) as c, pytest.raises(WaitTimeout) as info:
        c.wait("j3", timeout_s=10)
    assert info.value.job.status is JobStatus.RUNNING and isinstance(info.value, TimeoutError)
    # Each long-poll asks for at most what is left: 4 + 4 + 2 = the 10 s, never more.
    assert [s.params["wait"] for s in api.seen] == ["4.000", "4.000", "2.000"]
    assert clock.sleeps == []


def test_a_long_poll_answered_early_pauses_instead_of_spinning() -> None:
    api = FakeAPI([reply(200, job("j4", "queued"))] * 3 + [reply(200, job("j4"))])
    clock = FakeClock()
    with client(api, clock) as c:
        assert c.wait("j4").status is JobStatus.SUCCEEDED
    assert clock.sleeps == [0.25, 0.25, 0.25]


def test_wait_on_a_cancelled_job_raises_job_failed() -> None:
    cancelled = job(
        "j5", "cancelled", error={"code": "cancelled", "message": "cancelled by the client"}
    )
    with (
        client(FakeAPI([reply(200, cancelled)]), FakeClock()) as c,
        pytest.raises(JobFailed) as info,
    ):
        c.wait("j5")
    assert info.value.job.status is JobStatus.CANCELLED


# --- cancel ------------------------------------------------------------------------------


def test_cancel_returns_the_cancelled_job_and_409_if_it_had_ended() -> None:
    cancelled = job("j6", "cancelled", error={"code": "cancelled", "message": "m"})
    api = FakeAPI([reply(200, cancelled), error(409, "conflict", "already ended")])
    with client(api, FakeClock()) as c:
        assert c.cancel("j6").status is JobStatus.CANCELLED
        with pytest.raises(Conflict):
            c.cancel("j6")
    assert api.requests() == [("DELETE", "/v1/jobs/j6")] * 2


def test_a_cancel_whose_answer_was_lost_returns_the_job_it_cancelled() -> None:
    cancelled = job("j6", "cancelled", error={"code": "cancelled", "message": "m"})
    api = FakeAPI(
        [httpx.ReadError("lost"), error(409, "conflict", "already ended"), reply(200, cancelled)]
    )
    with client(api, FakeClock()) as c:
        assert c.cancel("j6").status is JobStatus.CANCELLED
    assert api.requests() == [("DELETE", "/v1/jobs/j6")] * 2 + [("GET", "/v1/jobs/j6")]


# --- embeddings --------------------------------------------------------------------------


def test_embed_asks_for_base64_and_returns_rows_in_input_order() -> None:
    data = [
        {"object": "embedding", "index": 1, "embedding": b64(VECTORS[1])},
        {"object": "embedding", "index": 0, "embedding": b64(VECTORS[0])},
    ]
    api = FakeAPI([reply(200, {"object": "list", "data": data, "model": "echo"})])
    with client(api, FakeClock(), long_poll_s=15) as c:
        got = c.embed(["hello world", "a b c"], model="echo")
    assert got.dtype == np.float32 and got.shape == (2, 4)
    np.testing.assert_array_equal(got, np.asarray(VECTORS, dtype=np.float32))
    body = api.seen[0].body
    assert body == {
        "input": ["hello world", "a b c"],
        "encoding_format": "base64",
        "wait": 15,
        "model": "echo",
    }
    assert api.seen[0].key


def test_embed_of_one_text_is_one_row() -> None:
    data = [{"object": "embedding", "index": 0, "embedding": VECTORS[0]}]  # float format too
    with client(FakeAPI([reply(200, {"data": data})]), FakeClock()) as c:
        assert c.embed("hello world").shape == (1, 4)


def test_embed_answered_202_long_polls_the_job_for_its_vectors() -> None:
    api = FakeAPI(
        [
            reply(
                202,
                {"id": "j8", "status": "queued", "model": "echo"},
                **{"x-should-retry": "false"},
            ),
            reply(200, job("j8", outputs=VECTORS)),
        ]
    )
    with client(api, FakeClock()) as c:
        got = c.embed(["hello world", "a b c"])
    np.testing.assert_array_equal(got, np.asarray(VECTORS, dtype=np.float32))
    assert api.requests() == [("POST", "/v1/embeddings"), ("GET", "/v1/jobs/j8")]


def test_embed_errors_in_openai_shape_map_to_the_tree() -> None:
    body = {
        "error": {
            "message": "model 'gpt' is not served",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }
    with client(FakeAPI([reply(404, body)]), FakeClock()) as c, pytest.raises(NotFound) as info:
        c.embed(["x"], model="gpt")
    assert info.value.code == "model_not_found"


# --- sync and async: the same flows ------------------------------------------------------


def _scenario() -> list[httpx.Response | Exception]:
    return [
        error(503, "unavailable", **{"Retry-After": "1"}),
        httpx.ConnectError("refused"),
        reply(202, job("p1", "queued")),
        reply(200, job("p1", "running")),
        reply(200, job("p1", outputs=VECTORS)),
    ]


def _record(api: FakeAPI, clock: FakeClock, got: Job) -> tuple[object, ...]:
    seen = [(s.method, s.path, s.params, s.body, s.key) for s in api.seen]
    return seen, clock.sleeps, got.to_dict()


async def test_sync_and_async_clients_send_the_same_requests_and_return_the_same_job() -> None:
    sync_api, sync_clock = FakeAPI(_scenario()), FakeClock()
    with client(sync_api, sync_clock) as c:
        sync_job = c.infer(["hello world", "a b c"], idempotency_key="k", model="echo")
    async_api, async_clock = FakeAPI(_scenario()), FakeClock()
    async with async_client(async_api, async_clock) as ac:
        async_job = await ac.infer(["hello world", "a b c"], idempotency_key="k", model="echo")
    assert _record(sync_api, sync_clock, sync_job) == _record(async_api, async_clock, async_job)
    assert len(sync_api.seen) == 5 and sync_job.status is JobStatus.SUCCEEDED


async def test_async_errors_are_the_same_tree() -> None:
    api = FakeAPI(handler=lambda r: error(429, "overloaded", "full", **{"Retry-After": "1"}))
    clock = FakeClock()
    async with async_client(api, clock) as c:
        with pytest.raises(Overloaded) as info:
            await c.submit(["a"])
    assert info.value.retry_after_s == 1.0 and len(api.seen) == 5 and len(clock.sleeps) == 4
    assert len({s.key for s in api.seen}) == 1
