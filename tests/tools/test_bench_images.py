"""`inferq bench --corpus images`: the photo corpus, its multipart bodies, the plan, the docs."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from starlette.datastructures import UploadFile
from starlette.requests import Request

from inferq import cli
from inferq.api.core.decode import image_format
from inferq.api.routes.jobs import read_submission
from inferq.bench import images, inputs, load, report
from inferq.bench import main as bench_main
from inferq.bench.http import Body
from inferq.bench.multipart import FilePart, encode
from inferq.shared.settings import Settings


def test_image_corpus_is_byte_identical_for_a_seed() -> None:
    a, b = images.generate(24), images.generate(24)
    assert [f.data for f in a] == [f.data for f in b]
    assert images.digest(a) == images.digest(b)
    # One draw sequence: a shorter corpus is a prefix of the full one.
    assert [f.data for f in a] == [f.data for f in images.load()[:24]]
    assert images.digest(images.generate(24, seed=1)) != images.digest(a)


def test_image_corpus_sizes_and_formats() -> None:
    from PIL import Image

    files = images.load()
    assert len(files) == images.SIZE
    assert len({f.name for f in files}) == len(files)
    formats = [image_format(f.data) for f in files]
    assert formats.count("PNG") == images.SIZE // images.PNG_EVERY
    assert formats.count("JPEG") == images.SIZE - formats.count("PNG")
    long_sides = []
    for f in files:
        with Image.open(io.BytesIO(f.data)) as im:
            assert im.size == (f.width, f.height) and im.mode == "RGB"
        long_side = max(f.width, f.height)
        high = images.PNG_LONG_SIDE if f.name.endswith(".png") else images.LONG_SIDE[1]
        assert images.LONG_SIDE[0] <= long_side <= high
        long_sides.append(long_side)
    # Varied: small and large uploads, many shapes, every source photo used.
    assert min(long_sides) < 300 and max(long_sides) > 800
    assert len({(f.width, f.height) for f in files}) > len(files) * 0.9
    assert {f.name.split("-", 1)[1].rsplit(".", 1)[0] for f in files} == {
        name for name, _ in images._sources()
    }


def _request(body: Body) -> Request:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body.data, "more_body": False}

    headers = [
        (b"content-type", body.content_type.encode()),
        (b"content-length", str(len(body.data)).encode()),
    ]
    scope = {"type": "http", "method": "POST", "path": "/v1/infer", "headers": headers}
    return Request(scope, receive)


async def test_multipart_body_parses_with_starlette() -> None:
    one, two = images.load()[0], images.load()[7]
    body = encode(
        [FilePart(one.name, one.mime, one.data), FilePart(two.name, two.mime, two.data)],
        {"model": "efficientnet-lite0"},
    )
    assert body.content_type.startswith("multipart/form-data; boundary=")
    async with _request(body).form() as form:
        uploads = form.getlist("files")
        assert [u.filename for u in uploads if isinstance(u, UploadFile)] == [one.name, two.name]
        assert [u.content_type for u in uploads if isinstance(u, UploadFile)] == [
            "image/jpeg",
            "image/png",
        ]
        datas = [await u.read() for u in uploads if isinstance(u, UploadFile)]
        assert datas == [one.data, two.data]
        assert form["model"] == "efficientnet-lite0"


async def test_multipart_body_is_what_inferq_infer_accepts() -> None:
    (body,) = inputs.image_bodies("efficientnet-lite0")[:1]
    sub, wait = await read_submission(_request(body), Settings(), "t", None, infer=True)
    assert sub.files == [images.load()[0].data] and sub.model == "efficientnet-lite0"
    assert wait is None and sub.items == []


def test_multipart_refuses_quotes_in_names() -> None:
    with pytest.raises(ValueError, match="quote"):
        encode([FilePart('a".jpg', "image/jpeg", b"\xff\xd8\xff")])


def test_image_inputs_cost_the_same_and_bodies_pass_through_the_load_generator() -> None:
    inp = inputs.load("images")
    assert inp.model == "efficientnet-lite0" and len(inp.bodies) == images.SIZE
    assert set(inp.costs) == {224 * 224}
    assert load._bodies(inp.bodies[:2]) == inp.bodies[:2]
    assert load._bodies(["hi"]) == [Body(b'{"input":"hi"}', "application/json")]


def test_cli_accepts_corpus_images(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bench_main.BenchOptions] = []

    def fake_main(args: bench_main.BenchOptions, argv: list[str]) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(bench_main, "main", fake_main)
    assert cli.main(["bench", "--corpus", "images", "--concurrency", "1,8,32"]) == 0
    plan = bench_main.plan_from(seen[0])
    assert plan.corpora == ("images",) and plan.concurrency == (1, 8, 32)
    assert plan.models() == {"efficientnet-lite0": ["images"]}
    assert plan.served("efficientnet-lite0") == ["seed", "inferq"]  # no LitServe for images
    assert plan.served("minilm") == ["seed", "inferq", "litserve", "infinity"]
    # ceiling 1 + (seed, inferq, inferq-jobs) × 3 loads + 2 open-loop + 2 front-end points
    assert plan.points() == 1 + 3 * 3 + 2 + 2
    both = bench_main.plan_from(bench_main.BenchOptions(corpus="short,images,mixed"))
    assert both.models() == {"minilm": ["short", "mixed"], "efficientnet-lite0": ["images"]}


def test_unknown_corpus_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main.main(bench_main.BenchOptions(corpus="short,photos"), []) == 2
    assert "unknown corpus 'photos'" in capsys.readouterr().err


def test_image_and_text_runs_keep_their_own_docs_sections(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nprose\n\n{bench_main.MARK}\n\nold text table\n")
    bench_main._write_image_docs(doc, "image table 1\n")
    bench_main._write_image_docs(doc, "image table 2\n")
    text = doc.read_text()
    assert "image table 2" in text and "image table 1" not in text
    assert text.index(bench_main.IMAGE_END) < text.index(bench_main.MARK)
    assert "old text table" in text
    bench_main._write_docs(doc, "new text table\n")
    text = doc.read_text()
    assert "image table 2" in text and "new text table" in text and "old text table" not in text
    assert text.startswith("# Benchmarks\n\nprose\n")


def test_image_targets() -> None:
    def row(
        system: str, mode: str, load_: Any, items_per_s: float, mem: float = 0.0
    ) -> dict[str, Any]:
        return {"system": system, "corpus": "images", "mode": mode, "load": load_,
                "items_per_s": items_per_s, "peak_mem_mb": mem}  # fmt: skip

    rows = [
        row("ceiling", "ceiling-batch", "best", 50.0),
        row("seed", "closed", 32, 20.0, 400.0),
        row("inferq", "closed", 32, 36.0, 600.0),
    ]
    got = {what: (value, v) for what, value, v in report.targets(rows, ["images"])}
    assert got == {
        "images: inferq ÷ seed at 32 clients (≥ 1.5)": ("1.80", "met"),
        "images: inferq ÷ ceiling at 32 clients (≥ 0.7)": ("0.72", "met"),
        "images: inferq worker peak MiB (report)": ("600", "–"),
        "images: seed process peak MiB (report)": ("400", "–"),
    }
