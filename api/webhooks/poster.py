"""One webhook delivery attempt: check the URL again, sign, POST to the checked address.

The contract (signature, headers, what each answer means) is `webhooks.contract`; who makes
attempts and what happens after each is `webhooks.dispatcher`.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from inferq.api.webhooks import ssrf
from inferq.api.webhooks.contract import (
    Delivery,
    Outcome,
    allow_list,
    attempt_budget_s,
    headers,
    outcome_of,
    signing_key,
)
from inferq.shared.settings import Settings


class Poster:
    """Makes one attempt: checks the URL again (DNS may have changed), signs, and POSTs to
    the address it checked, never following redirects. Every failure becomes an `Outcome`
    (a bad host name a dead one), never an exception."""

    def __init__(
        self,
        settings: Settings,
        *,
        resolve: ssrf.Resolver = ssrf.system_resolve,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.allow = allow_list(settings)
        self.resolve = resolve
        # httpx logs every request's URL at INFO; a webhook URL may carry the receiver's
        # token in its query, and secrets are never logged.
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
        # No keep-alive: a pooled connection is keyed by address, and reusing one opened
        # (and TLS-verified) for another host name on the same address would skip the check.
        # trust_env=False: an HTTP(S)_PROXY would connect by name, around the pinned address.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.webhook_timeout_s),
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(
                max_connections=settings.webhook_concurrency, max_keepalive_connections=0
            ),
            transport=transport,
        )

    async def attempt(self, d: Delivery) -> Outcome:
        key = signing_key(self.settings, d.tenant)
        if key is None:  # the configuration changed since submit: fixable, so retried
            return Outcome("retry", f"no signing key for tenant {d.tenant!r}")
        try:
            async with asyncio.timeout(attempt_budget_s(self.settings)):
                target = await ssrf.check(d.url, self.allow, self.resolve)
                hdrs = headers(key, d.id, d.body, int(time.time())) | {"Host": target.host_header}
                async with self.client.stream(
                    "POST",
                    target.pinned_url,
                    content=d.body,
                    headers=hdrs,
                    extensions=target.extensions,
                ) as r:
                    # The body is never read: a receiver cannot make us buffer anything.
                    return outcome_of(r.status_code, r.headers.get("retry-after"))
        except ssrf.WebhookRefused as e:
            return Outcome("dead", str(e))
        except TimeoutError:
            budget = attempt_budget_s(self.settings)
            return Outcome("retry", f"no answer within {budget:g}s", target_ok=False)
        except (httpx.HTTPError, OSError) as e:
            return Outcome("retry", f"{type(e).__name__}: {e}"[:200], target_ok=False)
        except (httpx.InvalidURL, ValueError) as e:  # no request can be made of this URL, ever
            return Outcome("dead", f"{type(e).__name__}: {e}"[:200])

    async def aclose(self) -> None:
        await self.client.aclose()
