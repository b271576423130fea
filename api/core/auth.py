"""Bearer-key auth: `INFERQ_API_KEYS` maps keys to tenants (jobs, files and batches belong
to their tenant); `INFERQ_ADMIN_KEYS` are the operator's, for health, metrics and workers.

Keys are compared in constant time against every configured key (no early exit that
would leak which prefix matched) and never logged.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from pydantic import SecretStr

from inferq.shared.errors import Forbidden, Unauthorized
from inferq.shared.settings import Settings


def load_api_keys(settings: Settings) -> dict[bytes, str]:
    """key → tenant, from 'tenant:key,...' or '@/path' (one 'tenant:key' per line)."""
    return _load(settings.api_keys, "INFERQ_API_KEYS")


def load_admin_keys(settings: Settings) -> dict[bytes, str]:
    """key → admin name, from INFERQ_ADMIN_KEYS (same forms as INFERQ_API_KEYS)."""
    return _load(settings.admin_keys, "INFERQ_ADMIN_KEYS")


def _load(secret: SecretStr | None, setting: str) -> dict[bytes, str]:
    if secret is None:
        return {}
    raw = secret.get_secret_value().strip()
    if raw.startswith("@"):
        raw = Path(raw[1:]).read_text()
    keys: dict[bytes, str] = {}
    for n, pair in enumerate(p.strip() for p in raw.replace("\n", ",").split(",")):
        if not pair or pair.startswith("#"):
            continue
        tenant, sep, key = pair.partition(":")
        if not sep or not tenant.strip() or not key.strip():
            raise ValueError(f"{setting} entry {n} is not 'name:key'")  # no value: it is secret
        keys[key.strip().encode()] = tenant.strip()
    if not keys:
        raise ValueError(f"{setting} is set but holds no 'name:key' pair")
    return keys


def _bearer(authorization: str) -> bytes:
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("missing 'Authorization: Bearer <key>'")
    return token.strip().encode()


def _owner(keys: dict[bytes, str], given: bytes) -> str:
    """Whose key `given` is ('' for none), comparing with every key in constant time."""
    found = ""
    for key, owner in keys.items():
        if hmac.compare_digest(given, key):
            found = owner
    return found


def tenant_of(keys: dict[bytes, str], authorization: str) -> str:
    """The tenant whose key the `Authorization` header carries ('' when the API is open)."""
    if not keys:
        return ""
    tenant = _owner(keys, _bearer(authorization))
    if not tenant:
        raise Unauthorized("invalid API key")
    return tenant


def check_admin(admins: dict[bytes, str], tenants: dict[bytes, str], authorization: str) -> None:
    """The operator's routes (health, metrics, workers): open only while no key of either
    kind is set; then an admin key only. A tenant's valid key gets 403, not 401."""
    if not admins and not tenants:
        return
    if not admins:
        raise Forbidden("this route needs an admin key, and none is set (INFERQ_ADMIN_KEYS)")
    given = _bearer(authorization)
    if _owner(admins, given):
        return
    if _owner(tenants, given):
        raise Forbidden("this route needs an admin key (INFERQ_ADMIN_KEYS), not a tenant's")
    raise Unauthorized("invalid API key")
