"""Bearer-key auth: `INFERQ_API_KEYS` maps keys to tenants; jobs belong to their tenant.

Keys are compared in constant time against every configured key (no early exit that
would leak which prefix matched) and never logged.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from inferq.shared.errors import Unauthorized
from inferq.shared.settings import Settings


def load_api_keys(settings: Settings) -> dict[bytes, str]:
    """key → tenant, from 'tenant:key,...' or '@/path' (one 'tenant:key' per line)."""
    if settings.api_keys is None:
        return {}
    raw = settings.api_keys.get_secret_value().strip()
    if raw.startswith("@"):
        raw = Path(raw[1:]).read_text()
    keys: dict[bytes, str] = {}
    for n, pair in enumerate(p.strip() for p in raw.replace("\n", ",").split(",")):
        if not pair or pair.startswith("#"):
            continue
        tenant, sep, key = pair.partition(":")
        if not sep or not tenant.strip() or not key.strip():
            raise ValueError(
                f"INFERQ_API_KEYS entry {n} is not 'tenant:key'"
            )  # no value: it is secret
        keys[key.strip().encode()] = tenant.strip()
    if not keys:
        raise ValueError("INFERQ_API_KEYS is set but holds no 'tenant:key' pair")
    return keys


def tenant_of(keys: dict[bytes, str], authorization: str) -> str:
    """The tenant whose key the `Authorization` header carries ('' when the API is open)."""
    if not keys:
        return ""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("missing 'Authorization: Bearer <key>'")
    given = token.strip().encode()
    tenant = ""
    for key, owner in keys.items():
        if hmac.compare_digest(given, key):
            tenant = owner
    if not tenant:
        raise Unauthorized("invalid API key")
    return tenant
