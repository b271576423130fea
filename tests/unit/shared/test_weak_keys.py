"""Keys and passwords a deployment must not ship with are refused at start, naming the
setting and never the value: short or placeholder API/admin keys, a placeholder Redis
password (deploy/k8s once shipped `change-me` ones that the API accepted silently)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferq.shared.settings import MIN_KEY_CHARS, Settings, check_keys, placeholder_word

GOOD = "alpha:" + "3f9c0d" * 4


@pytest.mark.parametrize(
    ("setting", "value", "why"),
    [
        ("api_keys", "alpha:change-me-alpha", "placeholder (it contains 'changeme')"),
        ("admin_keys", "prometheus:CHANGEME_prometheus_123", "placeholder"),
        ("admin_keys", "ops:my-secret-key-for-ops", "placeholder (it contains 'secret')"),
        ("api_keys", "alpha:placeholder-0000000000", "placeholder"),
        ("api_keys", "alpha:key-for-example-0000", "placeholder (it contains 'example')"),
        ("api_keys", f"{GOOD},beta:KEY_B", f"entry 1 ('beta'): the key has 5 characters, fewer than {MIN_KEY_CHARS}"),
        ("admin_keys", "ops:k-a81b44", "fewer than 16"),
        ("api_keys", "", "is set but holds no 'name:key' pair"),
        ("api_keys", " , # just a comment", "holds no 'name:key' pair"),
    ],
)  # fmt: skip
def test_weak_keys_are_refused_naming_the_setting_not_the_key(
    setting: str, value: str, why: str
) -> None:
    with pytest.raises(ValidationError) as e:
        Settings(**{setting: value})  # type: ignore[arg-type]
    (err,) = e.value.errors()
    assert f"INFERQ_{setting.upper()}" in err["msg"] and why in err["msg"]
    key = value.rpartition(":")[2]
    assert not key or key not in err["msg"]  # the message never carries the key


def test_strong_keys_and_the_file_form_pass() -> None:
    s = Settings(api_keys=f"{GOOD},beta:{'77a1e2' * 3}", admin_keys="ops:" + "a" * 16)  # type: ignore[arg-type]
    assert s.api_keys is not None
    # '@/path' is read by the API at start (inferq.api.core.auth), not here.
    assert Settings(api_keys="@/run/secrets/inferq-keys").api_keys is not None  # type: ignore[arg-type]
    check_keys("alpha:" + "x" * MIN_KEY_CHARS, "INFERQ_API_KEYS")


@pytest.mark.parametrize(
    "url",
    [
        "redis://:change-me@redis:6379/0",
        "rediss://:PASSWORD@redis.example.internal:6379/0",
        "redis://:change-me@sentinel-managed/0",
        "redis://default:Replace_Me@h1:6379,h2:6379/0",
    ],
)
def test_a_placeholder_redis_password_is_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="INFERQ_REDIS_URL carries a placeholder password"):
        Settings(redis_url=url)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "redis://:s3cr%3At%2Fpw@h:1/0", "unix:///tmp/r.sock"]
)
def test_real_or_no_redis_passwords_pass(url: str) -> None:
    assert Settings(redis_url=url).redis_url.get_secret_value() == url  # type: ignore[arg-type]


def test_placeholder_words_ignore_case_and_punctuation() -> None:
    assert placeholder_word("Change_Me") == "changeme"
    assert placeholder_word("3f9c0d77a1e2a81b44") is None
