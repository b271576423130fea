from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferq.shared import keys
from inferq.shared.settings import ModelSpec, Settings


def test_key_layout_is_pinned() -> None:
    assert keys.stream("minilm") == "inferq:{minilm.0}:jobs"
    assert keys.stream("minilm", "high") == "inferq:{minilm.0}:jobs:high"
    assert keys.dead("minilm") == "inferq:{minilm.0}:dead"
    assert keys.job("abc") == "inferq:job:abc"  # not a job id inferq makes: untagged
    assert keys.job("minilm.0.xYz-_1") == "inferq:job:{minilm.0}.xYz-_1"
    assert keys.done_channel("abc") == "inferq:done:abc"
    assert keys.DONE_PATTERN == "inferq:done:*"
    assert keys.job_id_from_channel(keys.done_channel("a-b_c")) == "a-b_c"
    assert keys.workers("echo") == "inferq:echo:workers"
    assert keys.worker("h:cpu:echo") == "inferq:worker:h:cpu:echo"
    assert keys.GROUP == "workers"
    # A file being written shares its content key's hash tag: the RENAME stays in one slot.
    assert keys.file_upload("f1", "w") == "inferq:file:{f1}:content:upload:w"


@pytest.mark.parametrize(
    ("spec", "name", "target"),
    [
        ("minilm", "minilm", "minilm"),
        ("flaky=tests.fixtures.models:FlakyEcho", "flaky", "tests.fixtures.models:FlakyEcho"),
        ("pkg.mod:MyModel", "mymodel", "pkg.mod:MyModel"),
    ],
)
def test_model_specs(spec: str, name: str, target: str) -> None:
    s = ModelSpec(spec)
    assert (s.name, s.target) == (name, target)


@pytest.mark.parametrize("spec", ["", "bad name", "x=", "a/b"])
def test_bad_model_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="invalid model spec"):
        ModelSpec(spec)


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_MODELS", "echo, minilm")
    monkeypatch.setenv("INFERQ_MODEL", "echo")
    monkeypatch.setenv("INFERQ_MAX_BATCH_TOKENS", "1024")
    monkeypatch.setenv("INFERQ_REDIS_URL", "redis://:s3cret@host:1/0")
    s = Settings()
    assert list(s.served_models) == ["echo", "minilm"]
    assert s.max_batch_tokens == 1024
    assert "s3cret" not in repr(s) and "s3cret" not in str(s.model_dump())
    assert s.prefetch_limit == 2 * s.max_batch_size


def test_default_model_is_always_served() -> None:
    s = Settings(model="echo", models=["minilm"])
    assert set(s.served_models) == {"echo", "minilm"}


@pytest.mark.parametrize(
    "kwargs",
    [{"max_batch_tokens": 0}, {"max_wait_ms": -1}, {"model": "a b"}, {"read_block_ms": 9000}],
)
def test_settings_refuse_bad_values(kwargs: dict) -> None:
    with pytest.raises(ValidationError):
        Settings(**kwargs)


def test_shard_tags_spread_over_the_slot_space_and_job_ids_find_their_shard() -> None:
    from redis.crc import key_slot

    for n in (2, 3, 4, 7, 16):  # one shard: its tag is just `<model>.0`, anywhere
        for s in range(n):
            t = keys.tag("my.model-1", s, n)
            slot = key_slot(t.encode())
            # The middle half of the shard's share: equal master ranges put shards apart.
            share = keys.SLOTS / n
            assert s * share + share / 4 - 1 <= slot < (s + 1) * share - share / 4 + 1, (n, s, t)
            job_id = f"{t}.AbC-_9"
            assert keys.job_shard(job_id) == ("my.model-1", s)
            assert key_slot(keys.job(job_id).encode()) == slot
            assert key_slot(keys.stream("my.model-1", "low", s, n).encode()) == slot
    for other in ("abc", "a.b", ".0.x", "m.x.y", "m.0.", "m.~1.x"):
        assert keys.job_shard(other) is None, other
