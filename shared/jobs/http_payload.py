"""The `http` kind's payload and settings (pure): what may be called, how, and how long it may take.

Payload: `url`; `method` (default POST); `headers` (a name is a token, a value a string of
printable Latin-1, or `{"secret": NAME}`: the app setting NAME, which must start with
`HTTP_SECRET_`, read at call time and never stored, and whose destinations `NAME_HOSTS` must
include the URL's host and port);
`body` (an object or array is sent as JSON, a string as text); `timeout_seconds` (default 30): how
long the downstream may take. The client waits `client_wait_s` = 1.2 x that, at least 2 s more
(120 s for a 100-s service), and that wait plus the connect timeout must fit in functionTimeout
less the run's margin, or the job is refused at POST.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.config.settings import Settings
from shared.core.errors import PayloadError
from shared.core.setting_reader import SettingReader
from shared.jobs.base import deadline_margin
from shared.jobs.outbound import HOSTS_SUFFIX, OutboundPolicy, read_outbound
from shared.net.destinations import BadUrl, destination
from shared.net.guard import Guard, Resolver, resolve

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
FIELDS = {"url", "method", "headers", "body", "timeout_seconds"}
SECRET_PREFIX = "HTTP_SECRET_"
RESERVED_HEADERS = {"idempotency-key", "host", "content-length", "transfer-encoding", "connection"}
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
DEFAULT_TIMEOUT_S = 30.0
MAX_URL_CHARS = 4096


def client_wait_s(timeout_s: float) -> float:
    """How long the client waits for a downstream allowed `timeout_s`: 1.2x, at least 2 s more (pure)."""
    return float(math.ceil(max(timeout_s * 1.2, timeout_s + 2.0)))


@dataclass(frozen=True)
class HttpKindSettings:
    """The `http` kind's settings (prefix `HTTP_`)."""

    outbound: OutboundPolicy = field(default_factory=OutboundPolicy)
    """`HTTP_ALLOWED_HOSTS` and each `HTTP_SECRET_<NAME>_HOSTS` (shared/jobs/outbound.py)."""
    connect_timeout_s: float = 5.0
    """`HTTP_CONNECT_TIMEOUT_SECONDS`."""
    follow_redirects: bool = False
    """`HTTP_FOLLOW_REDIRECTS` (true/false): follow 3xx answers, each target checked by the guard."""
    inline_body_bytes: int = 64 * 1024
    """`HTTP_INLINE_BODY_BYTES`: a larger answer body is put in a blob beside the result."""
    max_body_bytes: int = 16 * 1024 * 1024
    """`HTTP_MAX_BODY_BYTES`: the most of an answer body read and kept (the rest is cut)."""
    function_timeout_s: float = 300.0
    allowed_secrets: tuple[str, ...] | None = None
    """`HTTP_SECRETS` (a queue's `QUEUE_<NAME>_HTTP_SECRETS`): the secret settings payloads may
    name; None (unset): any `HTTP_SECRET_<NAME>`."""
    guard: Guard = field(default_factory=Guard)

    def longest_timeout_s(self) -> float:
        """The largest `timeout_seconds` that fits in functionTimeout less the margin (pure)."""
        room = (
            self.function_timeout_s - deadline_margin(self.function_timeout_s) - self.connect_timeout_s - 1.0
        )
        return max(0.0, min((room - 2.0), room / 1.2))


def read_settings(
    reader: SettingReader, settings: Settings, resolver: Resolver = resolve
) -> HttpKindSettings:
    """The kind's settings, each bad value a problem naming it."""
    outbound = read_outbound(reader, "HTTP_")
    config = HttpKindSettings(
        outbound=outbound,
        connect_timeout_s=reader.number("HTTP_CONNECT_TIMEOUT_SECONDS", 5.0, 0.1),
        follow_redirects=reader.choice("HTTP_FOLLOW_REDIRECTS", "false", ("true", "false")) == "true",
        inline_body_bytes=reader.integer("HTTP_INLINE_BODY_BYTES", 64 * 1024, 0),
        max_body_bytes=reader.integer("HTTP_MAX_BODY_BYTES", 16 * 1024 * 1024, 1024),
        function_timeout_s=settings.function_timeout_s,
        guard=outbound.guard(resolver),
        allowed_secrets=_split(reader.text("HTTP_SECRETS", "")) or None,
    )
    if config.longest_timeout_s() < 1.0:
        reader.problem(
            f"HTTP_CONNECT_TIMEOUT_SECONDS={config.connect_timeout_s:g} leaves no time for a call "
            f"within functionTimeout ({config.function_timeout_s:g}s)"
        )
    return config


@dataclass(frozen=True)
class HttpCall:
    """A validated payload."""

    url: str
    method: str
    headers: Mapping[str, str | Mapping[str, str]]
    body: Any
    has_body: bool
    timeout_s: float

    @property
    def wait_s(self) -> float:
        return client_wait_s(self.timeout_s)


def parse_call(payload: Mapping[str, Any], config: HttpKindSettings) -> HttpCall:
    """The call a payload asks for; PayloadError listing every problem (pure: no resolution)."""
    problems = [f"payload.{key}: unknown field" for key in sorted(set(payload) - FIELDS)]
    url = payload.get("url")
    if not isinstance(url, str) or not url.strip():
        problems.append("payload.url: required, an http(s) URL")
        url = ""
    elif len(url) > MAX_URL_CHARS:
        problems.append(f"payload.url: longer than {MAX_URL_CHARS} characters")
    else:
        refusal = config.guard.url_refusal(url)
        if refusal:
            problems.append(f"payload.url: {refusal}")
    method = payload.get("method", "POST")
    if not isinstance(method, str) or method.upper() not in METHODS:
        problems.append(f"payload.method: one of {', '.join(METHODS)}")
        method = "POST"
    headers = payload.get("headers", {})
    problems.extend(_header_problems(headers))
    problems.extend(_secret_problems(headers, str(url), config.outbound))
    problems.extend(_secret_refusals(headers, config.allowed_secrets))
    timeout = payload.get("timeout_seconds", DEFAULT_TIMEOUT_S)
    longest = config.longest_timeout_s()
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        problems.append("payload.timeout_seconds: a number of seconds > 0")
        timeout = DEFAULT_TIMEOUT_S
    elif timeout > longest:
        problems.append(
            f"payload.timeout_seconds: {timeout:g}s cannot fit: the client waits {client_wait_s(timeout):g}s "
            f"(1.2x) and a run has {config.function_timeout_s:g}s (functionTimeout) less its margin; "
            f"at most {math.floor(longest)}s"
        )
    if problems:
        raise PayloadError(problems)
    return HttpCall(
        url=str(url),
        method=str(method).upper(),
        headers=dict(headers) if isinstance(headers, Mapping) else {},
        body=payload.get("body"),
        has_body="body" in payload and payload.get("body") is not None,
        timeout_s=float(timeout),
    )


def printable_latin1(value: str) -> bool:
    """A header value HTTP/1.1 can carry as written: tab, space and visible Latin-1 (pure)."""
    return all(ch == "\t" or " " <= ch <= "~" or "\xa0" <= ch <= "\xff" for ch in value)


def _split(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


def _secret_refusals(headers: object, allowed: tuple[str, ...] | None) -> list[str]:
    """Secret settings the payload names that `HTTP_SECRETS` does not allow (pure)."""
    if allowed is None or not isinstance(headers, Mapping):
        return []
    return [
        f"payload.headers.{str(name)[:40]}: secret {value['secret']} is not allowed here (HTTP_SECRETS)"
        for name, value in headers.items()
        if isinstance(value, Mapping)
        and isinstance(value.get("secret"), str)
        and value["secret"] not in allowed
    ]


def _header_problems(headers: object) -> list[str]:
    if not isinstance(headers, Mapping):
        return ["payload.headers: an object of header names to values"]
    problems = []
    for name, value in headers.items():
        where = f"payload.headers.{name[:40] if isinstance(name, str) and _TOKEN.match(name) else '(a name)'}"
        if not isinstance(name, str) or not _TOKEN.match(name):
            problems.append(f"{where}: not a header name (letters, digits and !#$%&'*+.^_`|~-)")
        elif name.lower() in RESERVED_HEADERS:
            problems.append(f"{where}: set by the app, not by the payload")
        if isinstance(value, str):
            if len(value) > 8192 or not printable_latin1(value):
                problems.append(f"{where}: one line of at most 8192 printable Latin-1 characters")
        elif isinstance(value, Mapping) and set(value) == {"secret"}:
            secret = value["secret"]
            if (
                not isinstance(secret, str)
                or not re.fullmatch(SECRET_PREFIX + r"[A-Z0-9_]+", secret)
                or secret.endswith(HOSTS_SUFFIX)
            ):
                problems.append(
                    f"{where}: secret must name an app setting {SECRET_PREFIX}<NAME> (upper case, "
                    f"not ending in {HOSTS_SUFFIX})"
                )
        else:
            problems.append(f'{where}: a string, or {{"secret": "{SECRET_PREFIX}<NAME>"}}')
    return problems


def _secret_problems(headers: object, url: str, outbound: OutboundPolicy) -> list[str]:
    """Each secret header's setting must have the URL's host and port among its destinations."""
    if not isinstance(headers, Mapping):
        return []
    try:
        dest = destination(url)
    except BadUrl:
        return []
    problems = []
    for name, value in headers.items():
        secret = value.get("secret") if isinstance(value, Mapping) else None
        if isinstance(secret, str) and isinstance(name, str) and _TOKEN.match(name):
            refusal = outbound.secret_refusal(secret, dest)
            if refusal:
                problems.append(f"payload.headers.{name[:40]}: {refusal}")
    return problems
