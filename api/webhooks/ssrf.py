"""Where a webhook may point: http(s) only, never the inside of the network (SSRF guard).

A URL is checked at submit and again right before each delivery attempt, since what a name
resolves to can change in between (DNS rebinding). Every address the host resolves to must
be public, unless `INFERQ_WEBHOOK_ALLOW` lists the host name or a network holding the
address. The delivery then connects to the very address that was checked (`Target`), so no
second lookup exists that an attacker's DNS server could answer differently.

Exceptions: `WebhookRefused` (an `InputInvalid`: 422 at submit, a dead letter at delivery)
names the rule that refused the URL. A name that does not resolve raises `OSError`
(`socket.gaierror`) or `TimeoutError`: the caller decides whether that is final.
"""

from __future__ import annotations

import asyncio
import ipaddress
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


class WebhookRefused(InputInvalid):
    """A webhook URL that inferq will not call; the message names the rule."""


def _embedded(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv4-mapped or NAT64 IPv6 address stands for, else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def classify(address: IPAddress) -> str | None:
    """Why `address` is not a public one (e.g. 'a private address'), or None if it is.

    Order matters: 127.0.0.1 is also "private" to Python, and multicast is "global"."""
    ip = _embedded(address)
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
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "not a public address"
    return None


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
    if not parsed.host:
        raise WebhookRefused("webhook url has no host")
    if parsed.userinfo:
        # It would sit in Redis in the clear and travel in every log of the URL; the
        # signature is what authenticates inferq to the receiver.
        raise WebhookRefused("webhook url must not carry credentials (user:password@)")
    return parsed


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
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in await resolve(host, port)]
        if not addresses:
            raise OSError(f"webhook host {host} resolves to no address")
    for address in addresses:
        reason = classify(address)
        if reason is not None and not allow.admits(host, address):
            what = "is" if literal is not None else f"resolves to {address},"
            raise WebhookRefused(
                f"webhook host {host} {what} {reason}; allow it with {ALLOW_SETTING}"
            )
    return Target(parsed, str(addresses[0]))
