"""POST /v1/embeddings through the whole stack, driven by the official `openai` client."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import openai
import pytest

from inferq.worker.models.echo import expected_vector
from tests.integration.stack import Stack

TEXTS = ["hello world", "a b c", "the quick brown fox jumps", "x"]


@pytest.fixture
def clients() -> Iterator[Callable[[str], openai.OpenAI]]:
    """OpenAI clients for a base URL, each closed after the test (its connections with it)."""
    made: list[openai.OpenAI] = []

    def client(base: str) -> openai.OpenAI:
        made.append(
            openai.OpenAI(base_url=f"{base}/v1", api_key="dummy", max_retries=0, timeout=20)
        )
        return made[-1]

    yield client
    for c in made:
        c.close()


def test_float_and_base64_agree_with_echo(
    stack: Stack, clients: Callable[[str], openai.OpenAI]
) -> None:
    stack.worker()
    client = clients(stack.api())
    as_float = client.embeddings.create(model="echo", input=TEXTS, encoding_format="float")
    # Without encoding_format the client asks for base64 and decodes it itself.
    default = client.embeddings.create(model="echo", input=TEXTS)
    as_b64 = client.embeddings.create(model="echo", input=TEXTS, encoding_format="base64")
    assert as_float.model == "echo" and as_float.object == "list"
    assert [d.index for d in as_float.data] == list(range(len(TEXTS)))
    expected = np.array([expected_vector(t) for t in TEXTS], dtype=np.float32)
    for resp in (as_float, default):
        got = np.array([d.embedding for d in resp.data], dtype=np.float32)
        np.testing.assert_array_equal(got, expected)
    # Asked for explicitly, base64 comes back as the string: little-endian float32 bytes.
    raw = np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in as_b64.data])
    np.testing.assert_array_equal(raw, expected)
    words = sum(len(t.split()) for t in TEXTS)  # the API's approximation: whitespace words
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens == words


def test_single_string_and_raw_base64(stack: Stack) -> None:
    stack.worker()
    base = stack.api()
    r = httpx.post(
        f"{base}/v1/embeddings",
        json={"input": "only one", "model": "echo", "encoding_format": "base64"},
        timeout=20,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["data"]) == 1 and isinstance(body["data"][0]["embedding"], str)
    vec = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), "<f4")
    assert vec.tolist() == expected_vector("only one")
    assert body["usage"] == {"prompt_tokens": 2, "total_tokens": 2}


def test_errors_are_openai_shaped(stack: Stack, clients: Callable[[str], openai.OpenAI]) -> None:
    stack.worker()
    base = stack.api()
    client = clients(base)
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="gpt-nope", input="hi")
    assert "served" in str(e.value)
    cases = [
        ({"model": "echo"}, 400),  # no input
        ({"input": [], "model": "echo"}, 400),
        ({"input": [[1, 2, 3]], "model": "echo"}, 400),  # token arrays
        ({"input": "hi", "encoding_format": "fp16"}, 400),  # not offered (int8 is)
        ({"input": "   "}, 422),
        ({"input": "hi", "dimensions": 3}, 400),
    ]
    for body, status in cases:
        r = httpx.post(f"{base}/v1/embeddings", json=body, timeout=20)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert err["message"] and err["type"] and err["code"], err
    r = httpx.post(
        f"{base}/v1/embeddings", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"


def test_not_done_within_wait_is_202_with_location(stack: Stack) -> None:
    stack.worker(echo_batch_delay_ms=1500)
    base = stack.api()
    r = httpx.post(f"{base}/v1/embeddings", json={"input": "slow", "wait": 0.1}, timeout=20)
    assert r.status_code == 202, r.text
    assert r.json()["status"] in ("queued", "running")
    assert r.headers["x-should-retry"] == "false"
    job = httpx.get(f"{base}{r.headers['location']}", params={"wait": 10}, timeout=20).json()
    assert job["status"] == "succeeded" and job["outputs"] == [expected_vector("slow")]
