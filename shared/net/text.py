"""What the app's HTTP client says about a call (pure): server text made safe for messages, the
parts of a URL a message may name, and the kind of destination a refusal was about."""

from __future__ import annotations

import re
from collections.abc import Collection
from urllib.parse import urlsplit

from shared.net import secrets as in_play
from shared.net.destinations import BadUrl, Destination, destination

_SECRETS = re.compile(
    r"(Bearer\s+)[A-Za-z0-9._~+/=-]+"
    r"|((?:AccountKey|SharedAccessSignature|password|secret|token|sig)\s*[=:]\s*\"?)[^;&\s\"]+"
    r"|(dapi)[0-9a-f]{16,}"
    r"|(eyJ)[A-Za-z0-9._-]{20,}",
    re.IGNORECASE,
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def scrub(text: str, limit: int = 400, secrets: Collection[str] = ()) -> str:
    """Server text safe for logs and errors: `secrets` (values the caller sent) and the run's
    secrets in play masked in every encoding (shared/net/masking.py), anything token-like masked,
    all of it before control characters (line breaks, terminal escapes) are made spaces and the
    length is cut to `limit`."""
    masked = in_play.masker().with_(secrets).text(text)
    masked = _SECRETS.sub(
        lambda m: (m.group(1) or m.group(2) or m.group(3) or m.group(4) or "") + "***", masked
    )
    masked = _CONTROL.sub(" ", masked)
    return masked if len(masked) <= limit else masked[:limit] + "..."


_CATEGORIES = (
    "http://",
    "loopback",
    "link-local",
    "private",
    "unspecified",
    "multicast",
    "reserved",
    "site-local",
    "not globally routable",
    "own storage",
    "platform address",
    "IETF protocol assignment",
    "credentials in the URL",
    "port",
)


def refusal_category(text: str) -> str:
    """What kind of destination a refusal was about, without naming it (pure)."""
    found = next((c for c in _CATEGORIES if c in text), None)
    if found == "http://":
        return "http:// to a destination not allowed"
    return f"{found} destination" if found else "a destination not allowed"


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, the default port made explicit (pure)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return (
        parts.scheme.lower(),
        (parts.hostname or "").lower(),
        port or {"http": 80, "https": 443}.get(parts.scheme.lower()),
    )


def host_of(url: str) -> str:
    """`scheme://host:port` of a URL, without userinfo (for messages)."""
    try:
        dest: Destination | None = destination(url)
    except BadUrl:
        dest = None
    return f"{dest.scheme}://{dest}" if dest is not None else "(an invalid URL)"


def path_of(url: str) -> str:
    return re.sub(r"^\w+://[^/?#]+", "", url).split("?")[0] or "/"
