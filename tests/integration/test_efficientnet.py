"""efficientnet-lite0 on real photos: the right classes, batch-invariant, bad images fail alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferq.worker.models.base import Input, InputKind, InvalidInput
from inferq.worker.models.efficientnet import (
    CPU_BATCH,
    PIXELS,
    EfficientNetLite0,
    EfficientNetLite0Onnx,
)
from tests.fixtures.images import corrupt_jpeg, photo, png_bomb

CATS = {281, 282, 285}  # tabby, tiger cat, Egyptian cat
ESPRESSO = 967


@pytest.fixture(scope="module")
def torch_model() -> EfficientNetLite0:
    m = EfficientNetLite0()
    m.load("cpu")
    return m


def _run(
    model: EfficientNetLite0 | EfficientNetLite0Onnx, images: list[bytes], **params: int
) -> list:
    items = model.prepare([Input(InputKind.IMAGE, b) for b in images], params)
    return model.run([p.payload for p in items])


def test_classifies_real_photos(torch_model: EfficientNetLite0) -> None:
    cat, coffee = _run(torch_model, [photo("chelsea"), photo("coffee", "PNG")], top_k=3)
    assert {c["index"] for c in cat} <= CATS | {283}, cat  # its top three are all cats
    assert cat[0]["index"] in CATS
    assert coffee[0]["index"] == ESPRESSO and coffee[0]["label"] == "espresso", coffee
    for labels in (cat, coffee):
        scores = [c["score"] for c in labels]
        assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0001
    assert torch_model.traced  # one graph call per batch: no GIL per op


def test_batches_stay_small_on_a_cpu(torch_model: EfficientNetLite0) -> None:
    assert torch_model.default_batch_cost == CPU_BATCH * PIXELS
    gpu = EfficientNetLite0()
    gpu.bound_for("cuda:0")
    assert gpu.default_batch_cost == 32 * PIXELS  # where batching pays


def test_top_k_and_its_bounds(torch_model: EfficientNetLite0) -> None:
    (five,) = _run(torch_model, [photo("coffee")])
    assert len(five) == 5
    (one,) = _run(torch_model, [photo("coffee")], top_k=1)
    assert one == five[:1]
    with pytest.raises(InvalidInput, match="top_k"):
        _run(torch_model, [photo("coffee")], top_k=0)
    with pytest.raises(InvalidInput, match="unknown parameters"):
        _run(torch_model, [photo("coffee")], temperature=1)


def test_outputs_inside_a_mixed_batch_equal_one_by_one(torch_model: EfficientNetLite0) -> None:
    images = [photo("chelsea"), photo("coffee", "WEBP"), photo("astronaut", size=(300, 500))]
    together = _run(torch_model, images)
    for image, batched in zip(images, together, strict=True):
        (alone,) = _run(torch_model, [image])
        assert [c["index"] for c in alone] == [c["index"] for c in batched]
        np.testing.assert_allclose(
            [c["score"] for c in alone], [c["score"] for c in batched], atol=1e-5
        )


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (corrupt_jpeg(), "not a decodable image"),
        (png_bomb(10_000, 10_000), "decompression-bomb"),  # over Pillow's limit
        (png_bomb(30_000, 30_000), "decompression-bomb"),  # over twice it: Pillow itself refuses
        (b"", "not a decodable image"),
    ],
    ids=["corrupt", "bomb", "huge-bomb", "empty"],
)
def test_a_bad_image_is_refused_naming_its_index(
    torch_model: EfficientNetLite0, data: bytes, why: str
) -> None:
    with pytest.raises(InvalidInput, match=why) as info:
        _run(torch_model, [photo("coffee"), data])
    assert info.value.index == 1 and str(info.value).startswith("input 1:")


def test_onnx_backend_agrees_with_torch(torch_model: EfficientNetLite0, tmp_path: Path) -> None:
    onnx = EfficientNetLite0Onnx(tmp_path / "onnx")
    onnx.load("cpu")
    images = [photo("chelsea"), photo("coffee")]
    for a, b in zip(_run(onnx, images), _run(torch_model, images), strict=True):
        assert [c["index"] for c in a] == [c["index"] for c in b]
        np.testing.assert_allclose([c["score"] for c in a], [c["score"] for c in b], atol=1e-4)
    assert len(list((tmp_path / "onnx").glob("efficientnet-lite0-*-fp32.onnx"))) == 1
