"""`Submission.answered_inline`: which records of a request answered in its own response
live INFERQ_SYNC_RESULT_TTL_S, and which keep what they asked for."""

from __future__ import annotations

import pytest

from inferq.api.core.service import Submission
from inferq.shared.settings import Settings


@pytest.mark.parametrize(
    ("sub", "ttl"),
    [
        (Submission(), 120),  # plain: brief
        (Submission(idempotency_key="k"), 120),  # a key's retry comes within the brief time
        (Submission(result_ttl_s=900), 900),  # its own TTL: kept as asked
        (Submission(webhook="https://hooks.example/x"), None),  # a webhook: the default hour
    ],
)
def test_a_request_answered_in_its_response_is_kept_briefly_unless_it_asked(
    sub: Submission, ttl: int | None
) -> None:
    got = sub.answered_inline(Settings())
    assert got.result_ttl_s == ttl
    assert (got is sub) == (sub.result_ttl_s is not None or sub.webhook is not None)
    assert sub.result_ttl_s != 120  # the request's own parse is left as it was


def test_the_brief_time_is_capped_at_the_default() -> None:
    settings = Settings(result_ttl_s=30, sync_result_ttl_s=120)
    assert Submission().answered_inline(settings).result_ttl_s == 30
