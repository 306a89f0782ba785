"""The outbound guard: which destinations an outbound call may reach (pure decisions + resolution).

Refused unless the destination (host and port: shared/net/destinations.py) is in the guard's
allow list (`HTTP_ALLOWED_HOSTS` for the `http` kind, `<PREFIX>ALLOWED_HOSTS` for another kind):
plain `http://`; loopback names; the app's own storage endpoints (shared/net/endpoints.py: by
name, and by resolved address); and every address that is not globally reachable: loopback,
private, link-local (169.254.169.254, the metadata endpoint), unspecified, multicast, reserved,
site-local, shared (100.64.0.0/10), 192.0.0.0/24 (except 192.0.0.9 and 192.0.0.10, which IANA
lists as globally reachable), Azure's platform address 168.63.129.16, and IPv6 addresses carrying a
refused IPv4 one (mapped, 6to4, Teredo). An IPv4-mapped (`::ffff:`) or NAT64 (`64:ff9b::/96`)
address carrying a public IPv4 is that public address (IPv6-only networks with DNS64 work).

A name is resolved and every address judged; the connection goes to an allowed one
(`client.PinnedAdapter`), so a name that re-resolves elsewhere (DNS rebinding) cannot slip
through. A name whose addresses are mixed (split-horizon DNS: a public and a private one) calls
only the allowed ones: refusing it whole would break such names for no safety gained, since the
refused addresses are never connected to.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from shared.net.destinations import AllowList, BadUrl, Destination, IpAddress, destination
from shared.net.destinations import literal_address as _literal
from shared.net.endpoints import APP_ENDPOINTS, base_name

Resolver = Callable[[str, int], Sequence[str]]
PLATFORM_ADDRESS = ipaddress.IPv4Address("168.63.129.16")
"""Azure's virtual public address (DNS, health probes, the VM agent's wire server)."""
IETF_BLOCK = ipaddress.IPv4Network("192.0.0.0/24")
IETF_GLOBAL = frozenset({ipaddress.IPv4Address("192.0.0.9"), ipaddress.IPv4Address("192.0.0.10")})
"""The /32s of 192.0.0.0/24 that IANA's special-purpose registry lists as globally reachable."""
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
OWN_ADDRESSES_TTL_S = 300.0


class Refused(Exception):
    """The destination may not be called; the message says why (no secret, no connection made)."""


def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (TCP), in the resolver's order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def literal_address(host: str) -> IpAddress | None:
    """The address a host names literally (IPv4, IPv6 with or without brackets), else None."""
    return _literal(host.strip("[]").split("%")[0])


def address_refusal(address: IpAddress) -> str | None:
    """Why an address is refused (None: a globally reachable one) (pure)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address_refusal(address.ipv4_mapped)
        if address in NAT64:
            return address_refusal(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        embedded = [address.sixtofour, address.teredo[1] if address.teredo else None]
        for inner in embedded:
            why = address_refusal(inner) if inner is not None else None
            if why:
                return why
    else:
        if address == PLATFORM_ADDRESS:
            return f"Azure's platform address {address}"
        if address in IETF_GLOBAL:
            return None
        if address in IETF_BLOCK:
            return f"IETF protocol assignment (192.0.0.0/24) address {address}"
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
    """Where calls may go. `allowed`: destinations let through whatever they are or resolve to;
    `own_hosts`: storage endpoints refused besides the app's (`APP_ENDPOINTS`); `setting`: the
    setting a refusal names (the kind's `<PREFIX>ALLOWED_HOSTS`)."""

    allowed: AllowList = field(default_factory=AllowList)
    own_hosts: frozenset[str] = frozenset()
    resolver: Resolver = field(default=resolve, compare=False)
    setting: str = "HTTP_ALLOWED_HOSTS"
    _own_addresses: dict[str, tuple[float, frozenset[str]]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        allowed: Iterable[str] | str = (),
        own: Collection[str] = (),
        resolver: Resolver = resolve,
        setting: str = "HTTP_ALLOWED_HOSTS",
    ) -> Guard:
        """A guard from allowed entries (`host`, `host:port`; BadUrl naming a bad one)."""
        own_names = set()
        for host in own:
            try:
                own_names.add(base_name(destination(f"https://{host}/").host))
            except BadUrl:
                continue
        return cls(AllowList.parse(allowed), frozenset(own_names), resolver, setting)

    def allows(self, dest: Destination) -> bool:
        return self.allowed.allows(dest)

    def owns(self, host: str) -> bool:
        return APP_ENDPOINTS.owns(host, self.own_hosts)

    def url_refusal(self, url: str) -> str | None:
        """What the URL alone refuses (pure: syntax, scheme, literal address, own endpoints);
        None: resolve it."""
        try:
            dest = destination(url)
        except BadUrl as bad:
            return str(bad)
        return self.refusal(dest)

    def refusal(self, dest: Destination) -> str | None:
        """What a destination alone refuses (pure); None: resolve it."""
        if self.allows(dest):
            return None
        if dest.scheme == "http":
            return f"http:// is allowed only for destinations in {self.setting} ({dest} is not)"
        address = dest.address
        refusal = address_refusal(address) if address is not None else None
        if refusal:
            return f"{refusal} is not allowed ({self.setting}: {dest} is not in it)"
        if self.owns(dest.host):
            return f"{dest.host} is one of the app's own storage endpoints"
        if dest.host == "localhost" or dest.host.endswith(".localhost"):
            return f"{dest.host} is a loopback name"
        return None

    def checked_address(self, url: str) -> str:
        """The address to connect to for `url`: an allowed one of those it resolves to. Refused
        when the URL, or every address it resolves to, is refused; OSError when it does not resolve."""
        try:
            dest = destination(url)
        except BadUrl as bad:
            raise Refused(str(bad)) from None
        return self.checked(dest)

    def checked(self, dest: Destination) -> str:
        refusal = self.refusal(dest)
        if refusal:
            raise Refused(refusal)
        literal = dest.address is not None  # a literal address is not resolved
        addresses = [dest.host] if literal else [_canonical(a) for a in self.resolver(dest.host, dest.port)]
        if not addresses:
            raise OSError(f"{dest.host} resolved to no address")
        if self.allows(dest):
            return addresses[0]
        reasons: list[str] = []
        own = frozenset() if literal else self._own_addresses_now()
        for text in addresses:
            why = self.address_refusal(text, dest, own)
            if why is None:
                return text
            reasons.append(why)
        raise Refused(f"{dest.host} resolves to {reasons[0]}: not allowed ({self.setting})")

    def address_refusal(self, text: str, dest: Destination, own: frozenset[str]) -> str | None:
        """Why a resolved address of `dest` is refused (None: it may be called)."""
        if self.allowed.allows_address(text, dest):
            return None
        address = literal_address(text)
        if address is None:
            return "an unparseable address"
        why = address_refusal(address)
        if why is None and text in own:
            return f"an address of the app's own storage endpoints ({text})"
        return why

    def _own_addresses_now(self) -> frozenset[str]:
        """The addresses the app's storage endpoints resolve to (cached; a name that does not
        resolve adds none)."""
        now = time.monotonic()
        found: set[str] = set()
        for name in sorted(APP_ENDPOINTS.names() | self.own_hosts):
            if literal_address(name) is not None:
                found.add(_canonical(name))
                continue
            with self._lock:
                cached = self._own_addresses.get(name)
            if cached is None or now - cached[0] > OWN_ADDRESSES_TTL_S:
                try:
                    addresses = frozenset(_canonical(a) for a in self.resolver(name, 443))
                except Exception:  # an endpoint that does not resolve cannot be reached
                    addresses = frozenset()
                cached = (now, addresses)
                with self._lock:
                    self._own_addresses[name] = cached
            found |= cached[1]
        return frozenset(found)


def _canonical(text: str) -> str:
    address = literal_address(str(text))
    return str(address) if address is not None else str(text)
