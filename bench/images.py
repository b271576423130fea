"""The `images` corpus: scikit-image's bundled colour photos, seeded crops/resizes/flips.

Generated in memory at bench time (nothing binary is committed): `generate()` returns the
encoded files, JPEG mostly and one in eight PNG, byte-identical for a seed with the same
Pillow (its libjpeg/zlib do the encoding). Sizes vary the way uploads do: a random crop of
40-100 % of each side of a source photo, resized so its long side is 192-1024 px (PNG at most
512: lossless files of large photos would be megabytes), JPEG quality 70-95, half of them
mirrored. Every image costs the classifier the same (it resizes to 256 and crops 224), but
decoding does not: a 1024-px JPEG or a PNG costs several times a small JPEG to decode.
"""

from __future__ import annotations

import hashlib
import io
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

SEED = 20240606
SIZE = 96  # 12 per source photo: varied enough, and built in ~1.5 s at every bench start
LONG_SIDE = (192, 1024)
PNG_LONG_SIDE = 512
PNG_EVERY = 8
JPEG_QUALITY = (70, 95)


def _stereo_left() -> np.ndarray:
    import skimage.data

    left, _, _ = skimage.data.stereo_motorcycle()
    return left  # type: ignore[no-any-return]


def _sources() -> list[tuple[str, Callable[[], np.ndarray]]]:
    """The colour photos shipped inside scikit-image (no download). Synthetic ones
    (colorwheel, logo) and `cat` (chelsea again) are left out."""
    import skimage.data as d

    return [
        ("astronaut", d.astronaut),
        ("chelsea", d.chelsea),
        ("coffee", d.coffee),
        ("rocket", d.rocket),
        ("hubble_deep_field", d.hubble_deep_field),
        ("immunohistochemistry", d.immunohistochemistry),
        ("retina", d.retina),
        ("stereo_motorcycle", _stereo_left),
    ]


@cache
def _photos() -> tuple[tuple[str, np.ndarray], ...]:
    return tuple((name, load()) for name, load in _sources())


@dataclass(frozen=True, slots=True)
class ImageFile:
    """One encoded image of the corpus: `data` is the file as a client would upload it."""

    name: str  # e.g. "007-coffee.jpg": index, source photo, extension
    data: bytes
    width: int
    height: int

    @property
    def mime(self) -> str:
        return "image/png" if self.name.endswith(".png") else "image/jpeg"


def _one(rng: random.Random, photo: np.ndarray, png: bool) -> tuple[bytes, int, int]:
    from PIL import Image

    h, w = photo.shape[:2]
    cw, ch = round(w * rng.uniform(0.4, 1.0)), round(h * rng.uniform(0.4, 1.0))
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    im = Image.fromarray(np.ascontiguousarray(photo[y : y + ch, x : x + cw, :3]), "RGB")
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    long_side = rng.randint(LONG_SIDE[0], PNG_LONG_SIDE if png else LONG_SIDE[1])
    scale = long_side / max(cw, ch)
    im = im.resize(
        (max(1, round(cw * scale)), max(1, round(ch * scale))), Image.Resampling.BILINEAR
    )
    quality = rng.randint(*JPEG_QUALITY)  # drawn for PNG too, so one draw sequence per image
    buf = io.BytesIO()
    if png:
        im.save(buf, format="PNG", optimize=False, compress_level=6)
    else:
        im.save(buf, format="JPEG", quality=quality, optimize=False, progressive=False)
    return buf.getvalue(), im.width, im.height


def generate(n: int = SIZE, seed: int = SEED) -> list[ImageFile]:
    """`n` encoded images, sources taken in turn; the same seed gives the same bytes."""
    rng = random.Random(f"{seed}:images")
    photos = _photos()
    out = []
    for i in range(n):
        source, photo = photos[i % len(photos)]
        png = i % PNG_EVERY == PNG_EVERY - 1
        data, w, h = _one(rng, photo, png)
        out.append(ImageFile(f"{i:03d}-{source}.{'png' if png else 'jpg'}", data, w, h))
    return out


def digest(files: list[ImageFile]) -> str:
    """One sha256 over every name and file, to compare two generations (or machines)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + len(f.data).to_bytes(8, "little") + f.data)
    return h.hexdigest()


@cache
def load() -> tuple[ImageFile, ...]:
    """The corpus at its default size and seed, built once per process."""
    return tuple(generate())


if __name__ == "__main__":
    files = generate()
    total = sum(len(f.data) for f in files)
    print(f"{len(files)} images, {total / 2**20:.1f} MiB, sha256 {digest(files)}")
