"""The pure parts of `inferq bench`: corpora, statistics, padding, the table."""

from __future__ import annotations

import math

import pytest

from inferq.bench import corpus, load, report, stats


def test_corpus_generation_is_deterministic_and_matches_the_shipped_files() -> None:
    for name in corpus.CORPORA:
        texts = corpus.generate(name)
        assert texts == corpus.generate(name)
        assert corpus.path(name).read_text() == corpus.dumps(texts)
        assert corpus.load(name) == texts


def test_corpus_shapes() -> None:
    short = [len(t.split()) for t in corpus.generate("short")]
    mixed = sorted(len(t.split()) for t in corpus.generate("mixed"))
    assert min(short) >= 9 and max(short) <= 14
    assert mixed[0] >= 3 and mixed[-1] <= 230
    assert mixed[-1] > 5 * mixed[len(mixed) // 2]  # long tail
    with pytest.raises(ValueError, match="unknown corpus"):
        corpus.generate("nope")


def test_percentile_matches_linear_interpolation() -> None:
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert stats.percentile(xs, 0) == 1.0
    assert stats.percentile(xs, 50) == 3.0
    assert stats.percentile(xs, 100) == 5.0
    assert stats.percentile(xs, 25) == 2.0
    assert stats.percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert math.isnan(stats.percentile([], 50))


def test_summarize() -> None:
    s = stats.summarize([10.0] * 50, duration_s=2.0, errors=3)
    assert s["items_per_s"] == 25.0
    assert s["p50_ms"] == s["p99_ms"] == 10.0
    assert s["errors"] == 3.0 and s["n"] == 50.0


def test_padding_efficiency() -> None:
    assert stats.padding_efficiency(30, 40) == 0.75
    assert math.isnan(stats.padding_efficiency(1, 0))
    batches = stats.sorted_batches([5, 1, 3, 3], 2)
    assert batches == [[1, 3], [3, 5]]
    assert stats.packed_efficiency(batches) == pytest.approx(12 / 16)


def test_parse_batch_log() -> None:
    text = (
        "x INFO inferq.worker[1] batch items=4 tokens=64/8192 run_ms=10.0 held=4\n"
        "noise\n"
        "x DEBUG inferq.worker[1] batch items=2 tokens=20/8192 run_ms=4.0 mem=1/2/3MiB\n"
    )
    b = stats.parse_batch_log(text)
    assert (b.batches, b.items, b.padded_tokens) == (2, 6, 84)
    assert b.run_ms_mean == 7.0 and b.mean_batch == 3.0
    assert math.isnan(stats.parse_batch_log("").mean_batch)


def test_median_rows_across_repeats() -> None:
    runs = [
        [
            {"system": "a", "load": 1, "items_per_s": v, "note": "x"},
            {"system": "b", "load": 1, "items_per_s": 1.0},
        ]
        for v in (1.0, 5.0, 3.0)
    ]
    rows = stats.median_rows(runs, ("system", "load"))
    assert rows[0] == {"system": "a", "load": 1, "items_per_s": 3.0, "note": "x", "repeats": 3}
    assert rows[1]["system"] == "b"


def test_markdown_table_and_targets() -> None:
    rows = [
        {
            "system": "ceiling",
            "corpus": "short",
            "mode": "ceiling-1",
            "load": 1,
            "items_per_s": 100.0,
            "p50_ms": 5.0,
            "p99_ms": 6.0,
        },
        {
            "system": "ceiling",
            "corpus": "short",
            "mode": "ceiling-batch",
            "load": "best",
            "items_per_s": 500.0,
        },
        {
            "system": "inferq",
            "corpus": "short",
            "mode": "closed",
            "load": 1,
            "items_per_s": 90.0,
            "p50_ms": 5.5,
            "p99_ms": 10.0,
        },
        {
            "system": "inferq",
            "corpus": "short",
            "mode": "closed",
            "load": 32,
            "items_per_s": 450.0,
            "padding_eff": 0.9,
        },
        {
            "system": "seed",
            "corpus": "short",
            "mode": "closed",
            "load": 32,
            "items_per_s": 100.0,
            "p50_ms": math.nan,
        },
    ]
    md = report.table(rows[-1:])
    assert md.splitlines()[0].startswith("| system | mode | load | items/s |")
    assert "| seed | closed | 32 | 100 | – |" in md
    verdicts = {what: (value, v) for what, value, v in report.targets(rows, ["short"])}
    assert verdicts["short: inferq ÷ ceiling at 32 clients (≥ 0.8)"] == ("0.90", "met")
    assert verdicts["short: inferq ÷ seed at 32 clients (> 3)"] == ("4.50", "met")
    assert verdicts["short: queue overhead p50, ms (≤ 1)"] == ("0.5", "met")
    assert verdicts["short: queue overhead p99, ms (≤ 3)"] == ("4.0", "missed")
    assert verdicts["short: inferq ÷ LitServe at 32 clients (> 1)"][1] == "–"
    full = report.markdown(rows, ["short"], "t", "machine")
    assert "#### targets" in full and "machine" in full


def test_open_loop_arrivals_are_deterministic_and_bounded() -> None:
    a = load.arrivals(100.0, 2.0)
    assert a == load.arrivals(100.0, 2.0)
    assert all(0 < x < 2.0 for x in a) and a == sorted(a)
    assert 140 < len(a) < 260


def test_targets_only_localhost() -> None:
    with pytest.raises(ValueError, match=r"127\.0\.0\.1"):
        load.Target(("http://example.com:80",), "infer")
