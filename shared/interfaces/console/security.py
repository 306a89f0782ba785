"""Who may use the console, and the CSRF defence of its changes (pure decisions, no I/O).

In Azure, App Service Authentication (Easy Auth, Entra ID) signs operators in and passes the
principal on in `X-MS-CLIENT-PRINCIPAL` (base64 JSON with claims); Easy Auth removes that header
from incoming requests, so it is trusted only when the platform says Easy Auth is on
(`WEBSITE_AUTH_ENABLED`). The principal needs a role in `CONSOLE_ALLOWED_ROLES` or a group in
`CONSOLE_ALLOWED_GROUPS` (every queue), or one in a queue's `QUEUE_<NAME>_CONSOLE_ROLES` /
`QUEUE_<NAME>_CONSOLE_GROUPS` (that queue's jobs only: `Principal.queues`, enforced by
shared/interfaces/console/queue_access.py). Outside Azure (none of `shared.config.platform.AZURE_MARKERS`) and addressed to 127.0.0.1 (the
local host binds only there) the console is open, like the rest of the local API.

CSRF: every change is a POST carrying `X-Console-CSRF` equal to the `console_csrf` cookie
(SameSite=Strict, set by the pages), and that token must be one the app issued to this principal
less than `CSRF_TTL_S` ago: `<issued unix time>.<HMAC-SHA256(secret, principal, issued)>`. The secret
is the `CONSOLE_CSRF_SECRET` app setting (required in Azure; locally, when unset, a random one per
worker process, so a restarted worker asks for a page reload). The browser's `Origin` must be this
app's: the request's `Host` (App Service's front end forwards the client's `Host`, which it routed
on; `X-Forwarded-Host` is not set by it and is whatever a client sent, so it is ignored) or one of
`CONSOLE_PUBLIC_ORIGINS` (behind Front Door or Application Gateway); `Origin: null` is refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.cookies import CookieError, SimpleCookie
from urllib.parse import urlsplit

from shared.config.platform import in_azure
from shared.core.errors import SettingsError
from shared.queues import setting_name, wired_names

PRINCIPAL_HEADER = "x-ms-client-principal"
CSRF_COOKIE = "console_csrf"
CSRF_HEADER = "x-console-csrf"
ROLE_CLAIMS = ("roles", "http://schemas.microsoft.com/ws/2008/06/identity/claims/role")
GROUP_CLAIMS = ("groups",)
NAME_CLAIMS = ("preferred_username", "name", "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name")
ID_CLAIMS = (
    "http://schemas.microsoft.com/identity/claims/objectidentifier",
    "oid",
    "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/nameidentifier",
)
SECRET_SETTING = "CONSOLE_CSRF_SECRET"
ORIGINS_SETTING = "CONSOLE_PUBLIC_ORIGINS"
MIN_SECRET_CHARS = 32
CSRF_TTL_S = 12 * 3600.0
"""How long an issued token is accepted; pages reissue it once it is half that old."""
CLOCK_SKEW_S = 300.0
TOKEN_RE = re.compile(r"^[0-9]{1,12}\.[A-Za-z0-9_-]{43}$")


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
    id: str = ""
    """A stable identity (Entra object id), when the principal names one."""
    queues: frozenset[str] | None = None
    """The declared queues whose jobs it may see and act on (None: every queue)."""

    @property
    def subject(self) -> str:
        """What a CSRF token is bound to."""
        return f"{self.how}:{self.id or self.name}"


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
    ids = [str(c.get("val")) for t in ID_CLAIMS for c in claims if c.get("typ") == t and c.get("val")]
    return Principal(
        name=names[0] if names else "unknown",
        how=str(data.get("auth_typ") or "easyauth"),
        roles=values((*ROLE_CLAIMS, role_typ) if role_typ else ROLE_CLAIMS),
        groups=values(GROUP_CLAIMS),
        id=ids[0] if ids else "",
    )


LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


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
            403, "the console needs App Service Authentication (Entra ID) on this app; see docs/operations.md"
        )
    roles, groups = _listed(env, "CONSOLE_ALLOWED_ROLES"), _listed(env, "CONSOLE_ALLOWED_GROUPS")
    per_queue = queue_grants(env)
    if not roles and not groups and not per_queue:
        raise Denied(
            403,
            "no operator is allowed: set CONSOLE_ALLOWED_ROLES or CONSOLE_ALLOWED_GROUPS "
            "(or a queue's QUEUE_<NAME>_CONSOLE_ROLES / _GROUPS)",
        )
    raw = headers.get(PRINCIPAL_HEADER, "")
    if not raw:
        raise Denied(401, "sign in first: /.auth/login/aad")
    principal = decode_principal(raw)
    if principal.roles & roles or principal.groups & groups:
        return principal
    granted = frozenset(
        queue for queue, (r, g) in per_queue.items() if principal.roles & r or principal.groups & g
    )
    if granted:
        return replace(principal, queues=granted)
    raise Denied(403, f"{principal.name} has none of the roles or groups allowed to use the console")


def queue_grants(env: Mapping[str, str]) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Each declared queue's own operators: (roles, groups) from `QUEUE_<NAME>_CONSOLE_ROLES` /
    `QUEUE_<NAME>_CONSOLE_GROUPS`, for the queues that set either (pure)."""
    found = {}
    for queue in wired_names(env):
        roles = _listed(env, setting_name(queue, "CONSOLE_ROLES"))
        groups = _listed(env, setting_name(queue, "CONSOLE_GROUPS"))
        if roles or groups:
            found[queue] = (roles, groups)
    return found


def keyed_refusal(headers: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    """Why the admin-key route refuses a request (None: it may go on). Outside Azure the local host
    checks no key, so, like the console, it answers only requests addressed to the loopback
    interface: a page on another site whose name was rebound to 127.0.0.1 sends its own `Host`."""
    if in_azure(env) or is_local(headers, env):
        return None
    return f"the local console API answers requests to 127.0.0.1 or localhost only (Host: {headers.get('host', '')[:80]})"


def csrf_secret(env: Mapping[str, str]) -> bytes:
    """The key of the CSRF tokens: the setting; locally, when unset, this process's own random key."""
    value = env.get(SECRET_SETTING, "").strip()
    if value:
        if len(value) < MIN_SECRET_CHARS:
            raise SettingsError(
                f"{SECRET_SETTING} must be at least {MIN_SECRET_CHARS} characters (value not shown)"
            )
        return value.encode()
    if in_azure(env):
        raise SettingsError(
            f"{SECRET_SETTING} is not set: the console needs it in Azure (the template sets it)"
        )
    return _LOCAL_SECRET


_LOCAL_SECRET = secrets.token_bytes(32)


def public_origins(env: Mapping[str, str]) -> tuple[str, ...]:
    """`CONSOLE_PUBLIC_ORIGINS`: the origins (scheme://host[:port]) operators' browsers use, when a
    proxy in front (Front Door, Application Gateway) sends the app another `Host`."""
    return tuple(o.strip().rstrip("/").lower() for o in env.get(ORIGINS_SETTING, "").split(",") if o.strip())


def _mac(subject: str, issued: str, secret: bytes) -> str:
    message = f"console-csrf\x00{subject}\x00{issued}".encode()
    return base64.urlsafe_b64encode(hmac.new(secret, message, hashlib.sha256).digest()).decode().rstrip("=")


def issue_token(subject: str, secret: bytes, now: float) -> str:
    """A CSRF token for `subject`, issued at `now` (unix seconds)."""
    issued = str(int(now))
    return f"{issued}.{_mac(subject, issued, secret)}"


def token_refusal(
    token: str, subject: str, secret: bytes, now: float, ttl_s: float = CSRF_TTL_S
) -> str | None:
    """Why `token` is not a live token of `subject` (None: it is)."""
    if not TOKEN_RE.match(token):
        return "malformed CSRF token"
    issued, _, mac = token.partition(".")
    if not hmac.compare_digest(mac, _mac(subject, issued, secret)):
        return "CSRF token not issued to this operator by this app"
    age = now - int(issued)
    if age < -CLOCK_SKEW_S or age > ttl_s:
        return "CSRF token expired"
    return None


def cookie_token(headers: Mapping[str, str]) -> str | None:
    """The CSRF token of the request's cookie, if it has one that looks like ours."""
    jar = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except CookieError:
        return None
    morsel = jar.get(CSRF_COOKIE)
    token = morsel.value if morsel is not None else ""
    return token if TOKEN_RE.match(token) else None


def set_cookie(token: str, secure: bool) -> str:
    """The Set-Cookie value carrying the CSRF token to the console's pages and routes only."""
    return f"{CSRF_COOKIE}={token}; Path=/api/console; SameSite=Strict; HttpOnly" + (
        "; Secure" if secure else ""
    )


def check_csrf(
    method: str,
    headers: Mapping[str, str],
    url: str,
    *,
    subject: str,
    secret: bytes,
    now: float,
    origins: Sequence[str] = (),
) -> str | None:
    """Why a request may not change anything (None: it may). Only POST changes things."""
    if method != "POST":
        return f"{method} cannot change anything; changes are POSTs"
    cookie = cookie_token(headers)
    sent = headers.get(CSRF_HEADER, "")
    if cookie is None or not sent or not hmac.compare_digest(cookie, sent):
        return "missing or wrong CSRF token: reload the console page and try again"
    why = token_refusal(sent, subject, secret, now)
    if why is not None:
        return f"{why}: reload the console page and try again"
    return check_origin(headers, url, origins)


def check_origin(headers: Mapping[str, str], url: str, origins: Sequence[str] = ()) -> str | None:
    """Why a request from a browser on another site is refused (None: same origin, or not a browser).

    Same origin: the `Origin` names the request's `Host` (or, without one, the URL's), or is one of
    `origins`. `X-Forwarded-Host` is never consulted."""
    site = headers.get("sec-fetch-site", "")
    if site and site not in ("same-origin", "none"):
        return f"cross-site request refused (Sec-Fetch-Site: {site})"
    origin = headers.get("origin", "").strip()
    if not origin:
        return None
    if origin.lower() == "null":
        return "request from an opaque origin refused (Origin: null)"
    if origin.rstrip("/").lower() in origins:
        return None
    host = headers.get("host") or urlsplit(url).netloc
    if urlsplit(origin).netloc.lower() != host.lower():
        return f"request from another origin refused ({origin[:100]})"
    return None
