"""Any model through the whole stack: images by upload (multipart and base64) to a real
classifier, tensors, a detector's variable-length boxes, batched generation; and what the
API refuses before anything is queued."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.fixtures.images import corrupt_jpeg, photo, png_bomb
from tests.fixtures.tiny_lm import build
from tests.integration.stack import Stack

CATS = {281, 282, 285}
EFFICIENTNET = dict(model="efficientnet-lite0", models="efficientnet-lite0")


@pytest.fixture
def classifier(stack: Stack) -> str:
    stack.worker(**EFFICIENTNET)
    return stack.api(**EFFICIENTNET)


def test_upload_photos_get_their_classes(classifier: str) -> None:
    files = [("files", ("cat.jpg", photo("chelsea"), "image/jpeg")),
             ("files", ("coffee.png", photo("coffee", "PNG"), "image/png"))]  # fmt: skip
    r = httpx.post(
        f"{classifier}/v1/infer", files=files, data={"parameters": '{"top_k": 3}'}, timeout=60
    )
    assert r.status_code == 200, r.text
    cat, coffee = r.json()["outputs"]
    assert (
        len(cat) == 3
        and cat[0]["index"] in CATS
        and cat[0]["label"] in {"tabby", "tiger cat", "Egyptian cat"}
    )
    assert coffee[0] == {
        "label": "espresso",
        "index": 967,
        "score": pytest.approx(coffee[0]["score"]),
    }
    assert coffee[0]["score"] > 0.5
    # The same photo as base64 JSON gives the same answer.
    b64 = base64.b64encode(photo("coffee", "PNG")).decode()
    j = httpx.post(
        f"{classifier}/v1/infer",
        json={"input": {"image": b64}, "parameters": {"top_k": 3}},
        timeout=60,
    )
    assert j.status_code == 200 and j.json()["outputs"][0][0]["index"] == 967
    # The README's curl: one file, no parameters, the top 5.
    one = httpx.post(f"{classifier}/v1/infer", files=files[:1], timeout=60)
    assert one.status_code == 200 and len(one.json()["outputs"][0]) == 5
    assert one.json()["outputs"][0][:3] == cat


def test_a_corrupt_image_fails_alone_and_its_batch_mates_succeed(classifier: str) -> None:
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            bodies = [photo("chelsea"), corrupt_jpeg(), photo("coffee"), png_bomb(10_000, 10_000)]
            return await asyncio.gather(*(
                c.post(f"{classifier}/v1/infer", files=[("files", ("x", b, "image/jpeg"))])
                for b in bodies
            ))  # fmt: skip

    cat, corrupt, coffee, bomb = asyncio.run(go())
    assert cat.status_code == 200 and coffee.status_code == 200
    for bad, why in ((corrupt, "not a decodable image"), (bomb, "decompression-bomb")):
        assert bad.status_code == 422, bad.text
        error = bad.json()["error"]
        assert error["code"] == "invalid_input" and error["message"].startswith("input 0:")
        assert why in error["message"]


def test_what_the_api_refuses_before_queueing(stack: Stack) -> None:
    stack.worker(**EFFICIENTNET)
    base = stack.api(**EFFICIENTNET, max_image_bytes=50_000)
    big = photo("astronaut", "PNG")  # ~300 kB
    r = httpx.post(f"{base}/v1/jobs", files=[("files", ("big.png", big, "image/png"))], timeout=10)
    assert r.status_code == 413 and "INFERQ_MAX_IMAGE_BYTES=50000" in r.json()["error"]["message"]
    r = httpx.post(
        f"{base}/v1/jobs", files=[("files", ("x.gif", b"GIF89a...", "image/gif"))], timeout=10
    )
    assert r.status_code == 422 and "not a JPEG, PNG or WebP" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/v1/jobs", json={"input": "a text"}, timeout=10)
    assert r.status_code == 422
    msg = r.json()["error"]["message"]
    assert "efficientnet-lite0" in msg and "takes image" in msg and "input 0 is text" in msg
    small = photo("coffee", size=(64, 64))
    r = httpx.post(f"{base}/v1/jobs", files=[("files", ("c.jpg", small, "image/jpeg"))],
                   data={"parameters": '{"top_k": 2, "temperature": 1}'}, timeout=10)  # fmt: skip
    assert r.status_code == 422 and "['temperature']" in r.json()["error"]["message"]
    assert "top_k" in r.json()["error"]["message"]  # it says what the model does take
    r = httpx.post(f"{base}/v1/jobs", json={"input": {"image": "not base64!"}}, timeout=10)
    assert r.status_code == 422 and "base64" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/v1/jobs", files=[("files", ("c.jpg", small, "image/jpeg"))],
                   data={"priority": "urgent"}, timeout=10)  # fmt: skip
    assert r.status_code == 422 and "priority" in r.text


def test_the_byte_cap_refuses_with_429_and_retry_after(stack: Stack) -> None:
    base = stack.api(max_queue_bytes=1000)  # no worker: what is queued stays
    image = photo("coffee", size=(64, 64))
    assert len(image) > 1000
    files = [("files", ("c.jpg", image, "image/jpeg"))]
    assert httpx.post(f"{base}/v1/jobs", files=files, timeout=10).status_code == 202  # empty queue
    r = httpx.post(f"{base}/v1/jobs", files=files, timeout=10)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert "INFERQ_MAX_QUEUE_BYTES=1000" in r.json()["error"]["message"]


def test_tensors_in_json_as_base64_or_lists(stack: Stack) -> None:
    spec = "tsum=tests.fixtures.models:TensorSum"
    stack.worker(model=spec, models="tsum")
    base = stack.api(model="tsum", models="tsum")
    a = np.arange(6, dtype="<f4").reshape(2, 3)
    inputs = [
        {
            "tensor": {
                "dtype": "float32",
                "shape": [2, 3],
                "data": base64.b64encode(a.tobytes()).decode(),
            }
        },
        {"tensor": {"dtype": "int64", "shape": [2, 2], "data": [[1, 2], [3, 4]]}},
    ]
    r = httpx.post(f"{base}/v1/infer", json={"inputs": inputs}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == [{"sum": 15.0, "shape": [2, 3]}, {"sum": 10.0, "shape": [2, 2]}]
    bad = {
        "tensor": {
            "dtype": "float32",
            "shape": [3, 3],
            "data": base64.b64encode(a.tobytes()).decode(),
        }
    }
    r = httpx.post(f"{base}/v1/infer", json={"input": bad}, timeout=30)
    assert r.status_code == 422 and "needs 36" in r.json()["error"]["message"]
    r = httpx.post(
        f"{base}/v1/infer",
        json={"input": {"tensor": {"dtype": "complex64", "shape": [1], "data": []}}},
        timeout=30,
    )
    assert r.status_code == 422 and "dtype" in r.json()["error"]["message"]


def test_a_detectors_variable_length_boxes_come_back_intact(stack: Stack) -> None:
    spec = "boxes=tests.fixtures.models:Boxes"
    stack.worker(model=spec, models="boxes")
    base = stack.api(model="boxes", models="boxes")
    widths = [64, 65, 66, 67]  # width % 4 boxes each: 0, 1, 2, 3
    files = [
        ("files", (f"{w}.png", photo("coffee", "PNG", size=(w, 40)), "image/png")) for w in widths
    ]
    accepted = httpx.post(f"{base}/v1/jobs", files=files, timeout=10)
    assert accepted.status_code == 202
    body = httpx.get(
        f"{base}{accepted.headers['location']}", params={"wait": 20}, timeout=30
    ).json()
    assert body["status"] == "succeeded"
    assert [len(b) for b in body["outputs"]] == [0, 1, 2, 3]
    assert body["outputs"][3][2] == {"box": [2.0, 2.0, 65.0, 38.0], "label": "thing2", "score": 0.8}


def test_batched_generation_through_the_stack(stack: Stack, tmp_path: Path) -> None:
    path = build("gpt2", tmp_path / "tiny-gpt2")
    settings = dict(model="generate", models="generate", model_path=str(path), max_new_tokens=16)
    stack.worker(**settings)
    base = stack.api(**settings)
    r = httpx.post(f"{base}/v1/infer", json={"inputs": ["the cat sat", "a dog ran"],
                   "parameters": {"max_new_tokens": 5}}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    texts = r.json()["outputs"]
    assert all(isinstance(t, str) and 0 < len(t.split()) <= 5 for t in texts), texts
    r = httpx.post(
        f"{base}/v1/infer", json={"input": "x", "parameters": {"max_new_tokens": 17}}, timeout=60
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_input"
    assert "max_new_tokens" in r.json()["error"]["message"]
