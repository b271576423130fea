from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferq.shared import keys
from inferq.shared.errors import CodecError
from inferq.shared.jobs import (
    SCHEMA_VERSION,
    ErrorCode,
    Job,
    JobError,
    Status,
    decode_job,
    encode_final,
    encode_submit,
    input_bytes,
    inputs_bytes,
    new_job_id,
    published_job,
)


def _roundtrip(fields: dict[str, bytes]) -> Job:
    return decode_job({k.encode(): v for k, v in fields.items()})


def test_job_ids_are_their_shard_then_random_urlsafe_128_bits() -> None:
    ids = {new_job_id("my.model-1", 3) for _ in range(1000)}
    assert len(ids) == 1000
    for i in ids:
        assert i.startswith("my.model-1.3.")
        rest = i.removeprefix("my.model-1.3.")
        assert len(rest) == 22 and all(c.isalnum() or c in "-_" for c in rest)
        assert keys.job_shard(i) == ("my.model-1", 3)
        assert keys.job(i) == f"inferq:job:{{my.model-1.3}}.{rest}"


def test_submit_then_final_roundtrip_keeps_float32_bytes() -> None:
    job = Job(id="abc", model="echo", inputs=["x", "yé"], tenant="t1", deadline_ms=5)
    fields = encode_submit(job)
    assert msgpack.unpackb(fields["v"]) == SCHEMA_VERSION
    out = np.arange(8, dtype=np.float32).reshape(2, 4) / 3
    fields |= encode_final(
        Status.SUCCEEDED, finished_ms=job.created_ms + 9, outputs=out, batch=(2, 6)
    )
    back = _roundtrip(fields)
    assert back.status is Status.SUCCEEDED and back.inputs == ["x", "yé"] and back.tenant == "t1"
    assert back.outputs is not None and back.outputs.dtype == np.float32
    np.testing.assert_array_equal(back.outputs, out)
    assert back.timings()["total_ms"] == 9 and back.timings()["batch_tokens"] == 6
    # raw bytes travel, not nested lists
    assert isinstance(msgpack.unpackb(fields["outputs"])["data"], bytes)


def test_error_roundtrip_and_timings_while_queued() -> None:
    job = Job(id="e", model="m", inputs=["a"])
    fields = encode_submit(job) | encode_final(
        Status.FAILED, finished_ms=job.created_ms, error=JobError("model_error", "bad")
    )
    back = _roundtrip(fields)
    assert back.error == JobError("model_error", "bad") and back.outputs is None
    queued = _roundtrip(encode_submit(job))
    assert queued.timings() == {
        "queued_ms": None,
        "run_ms": None,
        "total_ms": None,
        "batch_size": None,
        "batch_tokens": None,
        "cached": False,
    }


@pytest.mark.parametrize(
    "mutate",
    [
        lambda f: f.update(v=msgpack.packb(99)),
        lambda f: f.pop("id"),
        lambda f: f.update(status=msgpack.packb("exploded")),
        lambda f: f.update(status=msgpack.packb(["queued"])),  # not even a string
        lambda f: f.update(inputs=b"\xc1"),
        lambda f: f.update(
            outputs=msgpack.packb({"dtype": "float32", "shape": [3], "data": b"12"})
        ),
    ],
)
def test_corrupt_records_raise_codec_error(mutate) -> None:  # type: ignore[no-untyped-def]
    fields = encode_submit(Job(id="c", model="m", inputs=["a"]))
    mutate(fields)
    with pytest.raises(CodecError):
        _roundtrip(fields)


def test_an_error_code_is_a_member_when_known_and_kept_as_written_when_not() -> None:
    job = Job(id="e", model="m", inputs=["a"])
    for code, member in (("model_error", True), ("from_a_newer_writer", False)):
        final = encode_final(Status.FAILED, finished_ms=1, error=JobError(code, "x"))
        back = _roundtrip(encode_submit(job) | final)
        assert back.error is not None and back.error.code == code
        assert isinstance(back.error.code, ErrorCode) is member
        assert back.status is Status.FAILED


def test_final_statuses() -> None:
    assert {s for s in Status if s.is_final} == {"succeeded", "failed", "expired", "cancelled"}


def test_fields_pack_as_packb_does_on_every_thread_and_after_a_failed_pack() -> None:
    """`_pack` keeps one Packer a thread: what it writes is `msgpack.packb`'s, on threads
    packing at once, and a value that cannot be packed leaves nothing behind for the next."""
    from concurrent.futures import ThreadPoolExecutor

    from inferq.shared.jobs import _pack

    values = [f"job-{i}" * (i % 7) for i in range(2000)] + [{"a": [1, 2.5, b"x"]}] * 50
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(_pack, values))
    assert got == [msgpack.packb(v, use_bin_type=True) for v in values]
    with pytest.raises(TypeError):
        _pack(["half", object()])
    assert _pack("next") == msgpack.packb("next", use_bin_type=True)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=6),
            st.builds(lambda b: {"image": b}, st.binary(max_size=6)),
            st.builds(lambda b: {"tensor": {"data": b}}, st.binary(max_size=6)),
            st.builds(lambda s: {"image": s}, st.text(max_size=3)),  # not bytes: weighs 0
            st.integers(),
        ),
        max_size=6,
    )
)
def test_a_jobs_inputs_weigh_what_each_input_weighs(values: list[object]) -> None:
    """`inputs_bytes`'s texts-only shortcut and its general case both equal the sum."""
    assert inputs_bytes(values) == sum(input_bytes(v) for v in values)


def _message(fields: dict[str, bytes]) -> bytes:
    return msgpack.packb([x for k, v in fields.items() for x in (k.encode(), v)])


def test_a_completion_message_is_laid_over_the_job_its_waiter_holds() -> None:
    queued = Job(id="j", model="m", inputs=["a", "b"], tenant="t", created_ms=100)
    queued.started_ms, queued.attempts = 150, 1  # as the waiter last read it: running
    out = np.ones((2, 3), np.float32)
    final = encode_final(Status.SUCCEEDED, finished_ms=300, outputs=out, batch=(2, 5), worker="w")
    job = published_job(_message(final), queued)
    assert job is not None and job is not queued and queued.status is Status.QUEUED
    assert (job.status, job.finished_ms, job.batch_size, job.batch_tokens, job.worker) == (
        Status.SUCCEEDED, 300, 2, 5, "w",
    )  # fmt: skip
    assert job.inputs == [] and job.items == 2 and job.tenant == "t"  # the record drops inputs
    assert np.array_equal(np.asarray(job.outputs), out)
    assert job.timings()["queued_ms"] == 50 and job.timings()["run_ms"] == 150
    # What the worker wrote while it ran comes with the message, and wins over the old read.
    later = _message({"started_ms": msgpack.packb(170), "attempts": msgpack.packb(2)} | final)
    job = published_job(later, queued)
    assert job is not None and (job.started_ms, job.attempts) == (170, 2)
    failed = encode_final(Status.FAILED, finished_ms=9, error=JobError(ErrorCode.MODEL_ERROR, "x"))
    job = published_job(_message(failed), queued)
    assert job is not None and job.error == JobError(ErrorCode.MODEL_ERROR, "x")
    assert job.outputs is None


@pytest.mark.parametrize(
    "payload",
    [
        None,
        b"",
        b"final",  # too large to send: read it back
        b"\xc1",  # not msgpack
        msgpack.packb({"status": "succeeded"}),  # not a flat list
        msgpack.packb([b"status"]),  # odd
        _message({"finished_ms": msgpack.packb(1)}),  # no status
        _message({"status": msgpack.packb("running")}),  # not final
        _message({"status": msgpack.packb("lost")}),  # no such status
        _message({"status": msgpack.packb("succeeded"), "outputs": msgpack.packb(7)}),
    ],
)
def test_a_completion_message_it_cannot_use_means_read_back(payload: bytes | None) -> None:
    assert published_job(payload, Job(id="j", model="m", inputs=["a"])) is None
