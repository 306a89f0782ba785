"""Who may use the console, and the CSRF defence of its changes (pure decisions, no I/O).

In Azure, App Service Authentication (Easy Auth, Entra ID) signs operators in and passes the
principal on in `X-MS-CLIENT-PRINCIPAL` (base64 JSON with claims); Easy Auth removes that header
from incoming requests, so it is trusted only when the platform says Easy Auth is on
(`WEBSITE_AUTH_ENABLED`). The principal needs a role in `CONSOLE_ALLOWED_ROLES` or a group in
`CONSOLE_ALLOWED_GROUPS`. Outside Azure (none of `AZURE_MARKERS`) and addressed to 127.0.0.1 (the
local host binds only there) the console is open, like the rest of the local API.

CSRF: every change is a POST carrying `X-Console-CSRF` equal to the `console_csrf` cookie
(SameSite=Strict, set by the pages), from the same origin when the browser says where it came from.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from urllib.parse import urlsplit

PRINCIPAL_HEADER = "x-ms-client-principal"
CSRF_COOKIE = "console_csrf"
CSRF_HEADER = "x-console-csrf"
ROLE_CLAIMS = ("roles", "http://schemas.microsoft.com/ws/2008/06/identity/claims/role")
GROUP_CLAIMS = ("groups",)
NAME_CLAIMS = ("preferred_username", "name", "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name")


class Denied(Exception):
    """The request may not use the console; `status` is 401 (sign in) or 403."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Principal:
    """Who is acting, as far as it is known."""

    name: str
    how: str
    roles: frozenset[str] = field(default_factory=frozenset)
    groups: frozenset[str] = field(default_factory=frozenset)


def decode_principal(value: str) -> Principal:
    """Parse Easy Auth's `X-MS-CLIENT-PRINCIPAL`; Denied(401) when it is not readable."""
    try:
        data = json.loads(base64.b64decode(value.encode("ascii"), validate=True))
    except (binascii.Error, ValueError, UnicodeError):
        raise Denied(401, "the signed-in principal could not be read; sign in again") from None
    if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
        raise Denied(401, "the signed-in principal has no claims; sign in again")
    claims = [c for c in data["claims"] if isinstance(c, dict)]
    role_typ = str(data.get("role_typ") or "")
    name_typ = str(data.get("name_typ") or "")

    def values(types: tuple[str, ...]) -> frozenset[str]:
        return frozenset(str(c.get("val")) for c in claims if c.get("typ") in types and c.get("val"))

    names = [str(c.get("val")) for c in claims if c.get("typ") in (name_typ, *NAME_CLAIMS) and c.get("val")]
    return Principal(
        name=names[0] if names else "unknown",
        how=str(data.get("auth_typ") or "easyauth"),
        roles=values((*ROLE_CLAIMS, role_typ) if role_typ else ROLE_CLAIMS),
        groups=values(GROUP_CLAIMS),
    )


AZURE_MARKERS = ("WEBSITE_INSTANCE_ID", "WEBSITE_SITE_NAME", "WEBSITE_HOSTNAME")
"""Set by the platform on every App Service / Functions instance."""
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def in_azure(env: Mapping[str, str]) -> bool:
    return any(env.get(name) for name in AZURE_MARKERS)


def is_local(headers: Mapping[str, str], env: Mapping[str, str]) -> bool:
    """The local host: no platform markers, and a request addressed to the loopback interface."""
    host = headers.get("host", "").lower()
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return not in_azure(env) and name in LOCAL_HOSTS


def _listed(env: Mapping[str, str], name: str) -> frozenset[str]:
    return frozenset(part.strip() for part in env.get(name, "").split(",") if part.strip())


def authorize(headers: Mapping[str, str], env: Mapping[str, str]) -> Principal:
    """The principal allowed to use the console, or Denied naming what is missing."""
    if is_local(headers, env):
        return Principal(name="local", how="local")
    if env.get("WEBSITE_AUTH_ENABLED", "").lower() != "true":
        raise Denied(
            403, "the console needs App Service Authentication (Entra ID) on this app; see the README"
        )
    roles, groups = _listed(env, "CONSOLE_ALLOWED_ROLES"), _listed(env, "CONSOLE_ALLOWED_GROUPS")
    if not roles and not groups:
        raise Denied(403, "no operator is allowed: set CONSOLE_ALLOWED_ROLES or CONSOLE_ALLOWED_GROUPS")
    raw = headers.get(PRINCIPAL_HEADER, "")
    if not raw:
        raise Denied(401, "sign in first: /.auth/login/aad")
    principal = decode_principal(raw)
    if principal.roles & roles or principal.groups & groups:
        return principal
    raise Denied(403, f"{principal.name} has none of the roles or groups allowed to use the console")


def cookie_token(headers: Mapping[str, str]) -> str | None:
    """The CSRF token of the request's cookie, if it has one that looks like ours."""
    jar = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except CookieError:
        return None
    morsel = jar.get(CSRF_COOKIE)
    token = morsel.value if morsel is not None else ""
    return token if 20 <= len(token) <= 100 and token.replace("-", "").replace("_", "").isalnum() else None


def new_token() -> str:
    return secrets.token_urlsafe(32)


def set_cookie(token: str, secure: bool) -> str:
    """The Set-Cookie value carrying the CSRF token to the console's pages and routes only."""
    return f"{CSRF_COOKIE}={token}; Path=/api/console; SameSite=Strict; HttpOnly" + (
        "; Secure" if secure else ""
    )


def check_csrf(method: str, headers: Mapping[str, str], url: str) -> str | None:
    """Why a request may not change anything (None: it may). Only POST changes things."""
    if method != "POST":
        return f"{method} cannot change anything; changes are POSTs"
    cookie = cookie_token(headers)
    sent = headers.get(CSRF_HEADER, "")
    if cookie is None or not sent or not hmac.compare_digest(cookie, sent):
        return "missing or wrong CSRF token: reload the console page and try again"
    return check_origin(headers, url)


def check_origin(headers: Mapping[str, str], url: str) -> str | None:
    """Why a request from a browser on another site is refused (None: same origin, or not a browser)."""
    site = headers.get("sec-fetch-site", "")
    if site and site not in ("same-origin", "none"):
        return f"cross-site request refused (Sec-Fetch-Site: {site})"
    origin = headers.get("origin", "")
    if origin and origin != "null":
        own = urlsplit(url)
        host = headers.get("x-forwarded-host") or headers.get("host") or own.netloc
        if urlsplit(origin).netloc.lower() != host.lower():
            return f"request from another origin refused ({origin})"
    return None
