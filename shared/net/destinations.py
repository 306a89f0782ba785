"""Where a call goes, parsed once and the same way everywhere (pure).

`destination(url)` is a URL's (scheme, host, port): the host lower case, without a trailing dot,
IDNA-normalised (a Unicode name and its punycode are one host), a literal address in its
canonical form (`[0:0:0:0:0:0:0:1]` is `::1`; the numeric IPv4 forms `2130706433`, `0x7f000001`,
`127.1`, `0177.0.0.1` are the dotted address they name, as resolvers read them), the port made
explicit (the scheme's default when absent). `BadUrl` (a ValueError) says what is wrong.

`AllowList.parse("partner.example:8443, 127.0.0.1")`: entries of a host and an optional port; an
entry without a port allows the default port of the destination's scheme only.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import idna

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
_NUMERIC_PART = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")


class BadUrl(ValueError):
    """A URL, host or port that cannot be called as written; the message says why."""


def canonical_port(text: str) -> int:
    """A port written in a URL or a setting: ASCII digits, 1 to 65535 (BadUrl otherwise)."""
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= 65535:
        raise BadUrl("a port is a number from 1 to 65535")
    return int(text)


def numeric_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host written as numbers names (inet_aton's forms: `2130706433`,
    `0x7f000001`, `127.1`, `0`, octal `0177.0.0.1`), None when it is not all numbers. BadUrl when
    it ends in a number yet names no address (as browsers read it)."""
    parts = host.split(".")
    if parts and parts[-1] == "" and len(parts) > 1:
        parts = parts[:-1]
    if not parts or not _NUMERIC_PART.match(parts[-1]):
        return None
    if not all(_NUMERIC_PART.match(p) for p in parts) or len(parts) > 4:
        raise BadUrl(f"{host[:80]} ends in a number but is not an IPv4 address")
    values = []
    for part in parts:
        if part.startswith("0x"):
            values.append(int(part[2:] or "0", 16))
        elif len(part) > 1 and part.startswith("0"):
            if not set(part) <= set("01234567"):
                raise BadUrl(f"{host} is not an IPv4 address")
            values.append(int(part, 8))
        else:
            values.append(int(part))
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        raise BadUrl(f"{host} is not an IPv4 address")
    number = last
    for i, value in enumerate(head):
        number += value << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def canonical_host(host: str) -> str:
    """A host as the guard compares it: a literal address canonical (IPv6 without brackets), a
    name lower case, without a trailing dot, in its IDNA ASCII form. BadUrl when it is neither."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(text[1:-1]))
        except ValueError:
            raise BadUrl("the address in brackets is not an IPv6 address") from None
    if ":" in text:
        try:
            return str(ipaddress.IPv6Address(text))
        except ValueError:
            raise BadUrl(f"{text[:80]!r} is not a host") from None
    name = text.lower().rstrip(".") if text not in (".", "") else ""
    if not name:
        raise BadUrl("no host")
    v4 = numeric_ipv4(name)
    if v4 is not None:
        return str(v4)
    if not name.isascii():
        try:
            name = idna.encode(name, uts46=True).decode("ascii")
        except idna.IDNAError:
            raise BadUrl("the host is not a valid international domain name") from None
    if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
        raise BadUrl("the host is not a valid domain name")
    if any(label.startswith("xn--") for label in name.split(".")):
        try:
            name = idna.encode(idna.decode(name), uts46=True).decode("ascii")
        except idna.IDNAError:
            raise BadUrl("the host is not a valid international domain name") from None
    return name


def literal_address(host: str) -> IpAddress | None:
    """The address a canonical host names literally, else None."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


@dataclass(frozen=True)
class Destination:
    """A call's scheme, canonical host and explicit port."""

    scheme: str
    host: str
    port: int

    @property
    def address(self) -> IpAddress | None:
        return literal_address(self.host)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def destination(url: str) -> Destination:
    """The destination of an http(s) URL with a host; BadUrl (saying what is wrong) otherwise.
    Userinfo (`user:pw@`) is refused: credentials go in a secret header."""
    if any(c in url for c in "\r\n\t") or not url.isprintable():
        raise BadUrl("the URL has control characters")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise BadUrl("the URL cannot be parsed") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise BadUrl("only http(s) URLs with a host may be called")
    netloc = parts.netloc
    if "@" in netloc:
        raise BadUrl("credentials in the URL are not allowed (use a secret header)")
    if not netloc:
        raise BadUrl("only http(s) URLs with a host may be called")
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise BadUrl("an IPv6 address in brackets is not closed")
        host_text, rest = netloc[: end + 1], netloc[end + 1 :]
        if rest and not rest.startswith(":"):
            raise BadUrl("text after the bracketed address")
        port_text = rest[1:] if rest else ""
    else:
        host_text, _, port_text = netloc.partition(":")
        if ":" in port_text:
            raise BadUrl("an IPv6 address must be in brackets")
    if "%" in host_text:
        raise BadUrl("zone ids and percent-escapes are not allowed in the host")
    port = canonical_port(port_text) if port_text else DEFAULT_PORTS[scheme]
    return Destination(scheme, canonical_host(host_text), port)


@dataclass(frozen=True)
class Allowed:
    """One allowed entry: a canonical host and a port (None: the scheme's default only)."""

    host: str
    port: int | None = None

    def matches(self, dest: Destination) -> bool:
        wanted = self.port if self.port is not None else DEFAULT_PORTS.get(dest.scheme)
        return self.host == dest.host and wanted == dest.port

    def matches_address(self, address: str, dest: Destination) -> bool:
        """An address entry (`127.0.0.1:8443`) lets a name that resolves to it through."""
        return Allowed(self.host, self.port).matches(Destination(dest.scheme, address, dest.port))


def parse_entry(text: str) -> Allowed:
    """`host`, `host:port`, `1.2.3.4:port`, `[::1]:port` or `::1`; BadUrl saying what is wrong."""
    entry = text.strip()
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise BadUrl(f"{entry!r}: text after the bracketed address")
        return Allowed(canonical_host(f"[{host}]"), canonical_port(rest[1:]) if rest else None)
    if entry.count(":") > 1:
        return Allowed(canonical_host(entry))
    host, sep, port = entry.partition(":")
    return Allowed(canonical_host(host), canonical_port(port) if sep else None)


@dataclass(frozen=True)
class AllowList:
    """Allowed destinations (a setting such as `HTTP_ALLOWED_HOSTS` or `HTTP_SECRET_<NAME>_HOSTS`)."""

    entries: tuple[Allowed, ...] = ()

    @classmethod
    def parse(cls, text: str | Iterable[str]) -> AllowList:
        """Comma-separated entries (or an iterable of them); BadUrl naming the first bad one."""
        items = text.split(",") if isinstance(text, str) else list(text)
        return cls(tuple(dict.fromkeys(parse_entry(t) for t in items if t.strip())))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def allows(self, dest: Destination) -> bool:
        return any(e.matches(dest) for e in self.entries)

    def allows_address(self, address: str, dest: Destination) -> bool:
        return any(e.matches_address(address, dest) for e in self.entries)

    def hosts(self) -> frozenset[str]:
        return frozenset(e.host for e in self.entries)

    def __str__(self) -> str:
        return ", ".join(f"{e.host}:{e.port}" if e.port else e.host for e in self.entries) or "(none)"
