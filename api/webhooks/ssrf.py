"""Where a webhook may point: http(s) only, never the inside of the network (SSRF guard).

A URL is checked at submit and again right before each delivery attempt, since what a name
resolves to can change in between (DNS rebinding). Every address the host resolves to must
be public, unless `INFERQ_WEBHOOK_ALLOW` lists the host name or a network holding the
address. The delivery then connects to the very address that was checked (`Target`), so no
second lookup exists that an attacker's DNS server could answer differently.

Exceptions: `WebhookRefused` (an `InputInvalid`: 422 at submit, a dead letter at delivery)
names the rule that refused the URL, never the address a name resolved to: a refusal that
said "resolves to 10.0.0.5" would let any caller map the inside of the network through our
resolver (the address goes to a DEBUG log line instead). A host that is no valid name (an
empty label, one over 63 characters: what the resolver's IDNA codec raises `UnicodeError`
for) is refused too, since no later attempt can fix it. A name that does not resolve raises
`OSError` (`socket.gaierror`) or `TimeoutError`: the caller decides whether that is final.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from inferq.shared.errors import InputInvalid

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: (host, port) → the addresses it resolves to, as strings, in preference order.
Resolver = Callable[[str, int], Awaitable[list[str]]]

SCHEMES = ("http", "https")
ALLOW_SETTING = "INFERQ_WEBHOOK_ALLOW"
# The metadata services of the big clouds (AWS, GCP, Azure: 169.254.169.254; AWS's IPv6 one).
METADATA = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254"))
# NAT64 (RFC 6052): an IPv6-only host reaches IPv4 through it, so judge the embedded address.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# DNS limits (RFC 1035): what the resolver's IDNA step refuses with a UnicodeError.
MAX_LABEL = 63
MAX_NAME = 253

log = logging.getLogger("inferq.api.webhooks")


class WebhookRefused(InputInvalid):
    """A webhook URL that inferq will not call; the message names the rule."""


def _stands_for(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv4-mapped or NAT64 IPv6 address stands for, else itself: such an
    address *is* its IPv4 one on the wire, so it is judged as that alone."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _tunnelled(address: IPAddress) -> tuple[str, tuple[ipaddress.IPv4Address, ...]]:
    """('6to4' | 'Teredo', the IPv4 addresses it carries) for a tunnel address, else ('', ()).
    A relay delivers such packets to the embedded IPv4 host, so that host is judged too."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.sixtofour is not None:
            return "6to4", (address.sixtofour,)
        if address.teredo is not None:
            return "Teredo", address.teredo  # (server, client)
    return "", ()


def _rule(ip: IPAddress) -> str | None:
    """Why `ip` itself is not a public address, or None.

    Order matters: 127.0.0.1 is also "private" to Python, and multicast is "global"."""
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip in METADATA:
        return "the cloud metadata address (link-local)"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_reserved:  # before private: Python counts 240.0.0.0/4 as both
        return "a reserved address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:  # fec0::/10: "global" to Python
        return "a site-local address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "not a public address"
    return None


def classify(address: IPAddress) -> str | None:
    """Why `address` is not a public one (e.g. 'a private address'), or None if it is.

    IPv4-mapped and NAT64 addresses are judged by the IPv4 address they stand for; 6to4 and
    Teredo ones by every IPv4 address they carry, then as themselves."""
    ip = _stands_for(address)
    tunnel, carried = _tunnelled(ip)
    for inner in carried:
        reason = _rule(inner)
        if reason is not None:
            return f"a {tunnel} address carrying {reason}"
    return _rule(ip)


@dataclass(frozen=True, slots=True)
class Allow:
    """`INFERQ_WEBHOOK_ALLOW`: host names (exact, case-insensitive) and networks."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allow:
        """Entries are host names, addresses or CIDRs; a bad CIDR raises ValueError."""
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for entry in (e.strip() for e in entries):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError as e:
                if "/" in entry or ":" in entry or any(c.isspace() for c in entry):
                    raise ValueError(
                        f"{ALLOW_SETTING}: {entry!r} is not a host, address or CIDR"
                    ) from e
                hosts.add(_host_key(entry))
        return cls(frozenset(hosts), tuple(networks))

    def admits(self, host: str, address: IPAddress) -> bool:
        if _host_key(host) in self.hosts:
            return True
        return any(address in net for net in self.networks if net.version == address.version)


def _host_key(host: str) -> str:
    return host.lower().rstrip(".")


@dataclass(frozen=True, slots=True)
class Target:
    """A checked webhook URL and the address to connect to."""

    url: httpx.URL
    address: str

    @property
    def pinned_url(self) -> httpx.URL:
        """The URL with its host replaced by the checked address."""
        return self.url.copy_with(host=self.address)

    @property
    def host_header(self) -> str:
        return self.url.netloc.decode("ascii")

    @property
    def extensions(self) -> dict[str, Any]:
        # TLS: verify the certificate against the name, though we connect to the address.
        return {"sni_hostname": self.url.raw_host.decode("ascii")}


def parse_url(url: str) -> httpx.URL:
    """`url` as httpx reads it, if it is http(s) with a host and no credentials."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as e:
        raise WebhookRefused(f"webhook url is not a valid URL: {e}") from e
    if parsed.scheme not in SCHEMES:
        raise WebhookRefused(f"webhook url scheme {parsed.scheme!r} is not http or https")
    raw_host = parsed.raw_host.decode("ascii", "replace")
    try:
        # `host` decodes an IDNA name, and httpx parses A-labels it cannot decode
        # ('xn--a-': "A-label must not end with a hyphen"): refused here, not a 500 later.
        host = parsed.host
    except ValueError as e:  # idna.IDNAError is a UnicodeError
        raise WebhookRefused(f"webhook host {raw_host} is not a valid host name: {e}") from e
    if not host:
        raise WebhookRefused("webhook url has no host")
    problem = None if _literal(host) is not None else _name_problem(raw_host)
    if problem is not None:
        raise WebhookRefused(f"webhook host {host} is not a valid host name: {problem}")
    if parsed.userinfo:
        # It would sit in Redis in the clear and travel in every log of the URL; the
        # signature is what authenticates inferq to the receiver.
        raise WebhookRefused("webhook url must not carry credentials (user:password@)")
    return parsed


def _name_problem(name: str) -> str | None:
    """What makes `name` (its ASCII form) no DNS name, or None. httpx accepts such hosts; the
    resolver then raises a UnicodeError, which no retry can fix."""
    name = name.removesuffix(".")  # one trailing dot: the root, a fully qualified name
    if len(name) > MAX_NAME:
        return f"longer than {MAX_NAME} characters"
    for label in name.split("."):
        if not label:
            return "an empty label"
        if len(label) > MAX_LABEL:
            return f"a label longer than {MAX_LABEL} characters"
    return None


async def system_resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, via the loop's resolver (a thread: never blocks)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def check(url: str, allow: Allow, resolve: Resolver = system_resolve) -> Target:
    """The `Target` to deliver `url` to; `WebhookRefused` if any address it resolves to
    is not public and not allowed. An IP literal is not looked up."""
    parsed = parse_url(url)
    host = parsed.host
    literal = _literal(host)
    if literal is not None:
        addresses = [literal]
    else:
        addresses = await _resolved(parsed, resolve)
    for address in addresses:
        reason = classify(address)
        if reason is not None and not allow.admits(host, address):
            if literal is not None:  # the caller's own address: naming it tells them nothing
                raise WebhookRefused(
                    f"webhook host {host} is {reason}; allow it with {ALLOW_SETTING}"
                )
            # The rule only: the address a name resolves to stays on this side (DNS oracle).
            log.debug("webhook host %s refused: it resolves to %s, %s", host, address, reason)
            raise WebhookRefused(
                f"webhook host {host} resolves to {reason}; allow it with {ALLOW_SETTING}"
            )
    return Target(parsed, str(addresses[0]))


async def _resolved(parsed: httpx.URL, resolve: Resolver) -> list[IPAddress]:
    """The addresses `parsed.host` resolves to; OSError/TimeoutError as the resolver raises
    them, `WebhookRefused` for a ValueError (a name the IDNA codec refuses, say): final."""
    host, port = parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        found = await resolve(host, port)
    except ValueError as e:  # UnicodeError included: no later lookup can succeed
        raise WebhookRefused(f"webhook host {host} is not a valid host name: {e}") from e
    if not found:
        raise OSError(f"webhook host {host} resolves to no address")
    try:
        return [ipaddress.ip_address(a.split("%", 1)[0]) for a in found]
    except ValueError as e:  # the resolver's answer, not the caller's: not echoed
        raise WebhookRefused(f"webhook host {host} resolves to something not an address") from e
