"""The outbound guard: which addresses an outbound call may reach (pure decisions + resolution).

Refused unless the host is listed in `HTTP_ALLOWED_HOSTS`: loopback, private (RFC 1918, unique
local), link-local (169.254.0.0/16: the cloud metadata endpoint 169.254.169.254; fe80::/10),
unspecified, multicast, reserved, site-local and any other address that is not globally routable
(the shared 100.64.0.0/10, where some clouds keep their metadata service), IPv6 addresses carrying
one of those (IPv4-mapped, 6to4, Teredo), the app's own storage endpoints, and `http://`.
The decision is made on the resolved address, and the connection goes to that very address
(`client.PinnedAdapter`): a name that resolves to a public address when checked and to a private
one when connecting (DNS rebinding) cannot slip through.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

Resolver = Callable[[str, int], Sequence[str]]
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(Exception):
    """The destination may not be called; the message says why (no secret, no connection made)."""


def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (TCP), in the resolver's order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def literal_address(host: str) -> IpAddress | None:
    """The address a host names literally (IPv4, IPv6 with or without brackets), else None."""
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None


def address_refusal(address: IpAddress) -> str | None:
    """Why an address is refused (None: a public address) (pure). An IPv6 address that carries an
    IPv4 one (mapped, 6to4, Teredo's client) is judged by that too."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = [address.ipv4_mapped, address.sixtofour, address.teredo[1] if address.teredo else None]
        for inner in embedded:
            why = address_refusal(inner) if inner is not None else None
            if why:
                return why
    checks = (
        (address.is_unspecified, "unspecified"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local (the metadata endpoint's range)"),
        (address.is_private, "private"),
        (address.is_multicast, "multicast"),
        (address.is_reserved, "reserved"),
        (isinstance(address, ipaddress.IPv6Address) and address.is_site_local, "site-local"),
        (not address.is_global, "not globally routable (e.g. shared 100.64.0.0/10)"),
    )
    for hit, what in checks:
        if hit:
            return f"{what} address {address}"
    return None


@dataclass(frozen=True)
class Guard:
    """Where calls may go. `allowed_hosts`: names (lower case) or literal addresses let through
    whatever they resolve to; `own_hosts`: the app's storage endpoints, refused unless allowed."""

    allowed_hosts: frozenset[str] = frozenset()
    own_hosts: frozenset[str] = frozenset()
    resolver: Resolver = field(default=resolve, compare=False)

    @classmethod
    def of(cls, allowed: Collection[str], own: Collection[str] = (), resolver: Resolver = resolve) -> Guard:
        return cls(frozenset(h.lower() for h in allowed), frozenset(h.lower() for h in own), resolver)

    def allows_host(self, host: str) -> bool:
        return host.lower().strip("[]") in self.allowed_hosts

    def url_refusal(self, url: str) -> str | None:
        """What the URL alone refuses (pure: scheme, literal address, own endpoints); None: resolve it."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme not in ("http", "https") or not host:
            return "only http(s) URLs with a host may be called"
        if parts.username or parts.password:
            return "credentials in the URL are not allowed (use a secret header)"
        if self.allows_host(host):
            return None
        if parts.scheme == "http":
            return f"http:// is allowed only for hosts in HTTP_ALLOWED_HOSTS ({host} is not)"
        if host in self.own_hosts:
            return f"{host} is one of the app's own storage endpoints"
        if host.rstrip(".") == "localhost" or host.rstrip(".").endswith(".localhost"):
            return f"{host} is a loopback name"
        address = literal_address(host)
        refusal = address_refusal(address) if address is not None else None
        return f"{refusal} is not allowed (HTTP_ALLOWED_HOSTS)" if refusal else None

    def checked_address(self, url: str) -> str:
        """The address to connect to for `url`, every resolved address checked; Refused when the
        URL or any address it resolves to is refused. OSError when the name does not resolve."""
        refusal = self.url_refusal(url)
        if refusal:
            raise Refused(refusal)
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses = list(self.resolver(host, port))
        if not addresses:
            raise OSError(f"{host} resolved to no address")
        if not self.allows_host(host):
            for text in addresses:
                address = literal_address(text)
                why = "an unparseable address" if address is None else address_refusal(address)
                if why:
                    raise Refused(f"{host} resolves to {why}: not allowed (HTTP_ALLOWED_HOSTS)")
        return addresses[0]
