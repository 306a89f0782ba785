"""The app's one HTTP client: explicit timeouts, a time budget, error classification, Retry-After.

Errors map to shared.core.errors: connection failures, timeouts, 408, 429 and 5xx are transient
(`DownstreamUnavailable`, carrying the answer's Retry-After; a read timeout is the subclass
`ReadTimedOut` because the server may have acted on the request); other 4xx are
`DownstreamRejected` (permanent). Messages name the request as sent (never a redirect's target,
never userinfo or request headers), and server text is masked (the run's secrets in every
encoding, anything token-like) before it is cut (shared/net/text.py). A request that carries a
secret in play goes only to that secret's destinations (shared/net/secrets.py).

The time budget: inside `step_budget(s)` or `deadline_at(t)` (a handler's run is inside its
`ctx.deadline`), every call's timeouts are cut to what is left, and a call that cannot fit is not
made (`BudgetSpent`, transient: tried later). With a `guard` (shared/net/guard.py) a call goes
only to a checked address, the connection made to that address, redirects followed only when
the client says so and each checked the same way.

Call notes: a client made with `record=True` notes each call's outcome (the status, or why there
was none: timeout, connection error, refused, no time left) and its duration in the list that
`calls_recorded()` opened. A job's run opens one (shared/pipeline/processing.py) and the notes go
into the ledger write that ends the attempt (its `downstream`): no storage request more.
"""

from __future__ import annotations

import contextlib
import contextvars
import email.utils
import json as jsonlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import requests
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from shared.core.errors import DestinationRefused, DownstreamRejected, DownstreamUnavailable, PermanentError
from shared.net import secrets as in_play
from shared.net.destinations import destination
from shared.net.guard import Guard, Refused
from shared.net.text import host_of, origin, path_of, refusal_category
from shared.net.text import scrub as scrub  # callers import it from here too

PROPAGATOR = TraceContextTextMapPropagator()
logging.getLogger("urllib3").setLevel(logging.WARNING)
"""urllib3 logs each request's path at DEBUG (queries may carry tokens): kept out of the app's logs."""

MAX_THROTTLE_RETRIES = 2
MAX_REDIRECTS = 5
MAX_CALL_NOTES = 20
"""The most call notes one `calls_recorded()` keeps (a run's later calls are not noted)."""
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
"""Never sent on to another origin by a redirect (nor the caller's `secret_headers`)."""
TRANSIENT_STATUSES = frozenset({408, 429})
"""Besides 5xx: answers that say "later" (Request Timeout, Too Many Requests)."""


class ReadTimedOut(DownstreamUnavailable):
    """No answer within the read timeout: the server may have acted on the request."""


class BudgetSpent(DownstreamUnavailable):
    """The time left (a step budget or the job's deadline) cannot fit the call: not made (later)."""


_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("http_deadline", default=None)


@contextlib.contextmanager
def deadline_at(deadline: float) -> Iterator[None]:
    """Every call made inside ends by `deadline` (time.monotonic); nested ones keep the earlier."""
    outer = _deadline.get()
    token = _deadline.set(deadline if outer is None else min(outer, deadline))
    try:
        yield
    finally:
        _deadline.reset(token)


@contextlib.contextmanager
def step_budget(seconds: float, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """Every HTTP call made inside ends within `seconds` from now (e.g. SPARK_STEP_BUDGET_SECONDS)."""
    with deadline_at(clock() + seconds):
        yield


CallNote = dict[str, Any]
"""One call's outcome: `{"status": 503, "ms": 12}` or `{"error": "timeout", "ms": 7003}`."""
_calls: contextvars.ContextVar[list[CallNote] | None] = contextvars.ContextVar("http_calls", default=None)


@contextlib.contextmanager
def calls_recorded() -> Iterator[list[CallNote]]:
    """The notes of the calls made inside by clients with `record=True` (at most MAX_CALL_NOTES)."""
    notes: list[CallNote] = []
    token = _calls.set(notes)
    try:
        yield notes
    finally:
        _calls.reset(token)


def call_error(exc: BaseException) -> str:
    """What a call that got no wanted answer is noted as, when no status came back (pure)."""
    if isinstance(exc, BudgetSpent):
        return "not made: no time left"
    if isinstance(exc, ReadTimedOut):
        return "timeout"
    if isinstance(exc, DestinationRefused):
        return "refused by the outbound guard"
    if isinstance(exc, DownstreamUnavailable):
        return "connection error"
    return "bad request"


def remaining_budget(clock: Callable[[], float] = time.monotonic) -> float | None:
    """Seconds left in the current budget (None: no budget set)."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - clock()


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Parse a Retry-After header (delta seconds or HTTP date)."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def transient_status(code: int) -> bool:
    """5xx, 408, 429: the downstream may answer otherwise later (pure)."""
    return code >= 500 or code in TRANSIENT_STATUSES


class _PinnedMixin:
    """Connects to `pinned` (a checked address) while the URL's host stays the Host header, the
    TLS server name and the certificate's expected name."""

    pinned = ""
    _dns_host: str

    def _new_conn(self) -> Any:
        saved, self._dns_host = self._dns_host, self.pinned
        try:
            return super()._new_conn()  # type: ignore[misc]
        finally:
            self._dns_host = saved


class PinnedAdapter(HTTPAdapter):
    """A transport whose connections all go to one checked address."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__(max_retries=0)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, **kwargs)
        addr = self.address
        http_conn = type("PinnedHTTPConnection", (_PinnedMixin, HTTPConnection), {"pinned": addr})
        https_conn = type("PinnedHTTPSConnection", (_PinnedMixin, HTTPSConnection), {"pinned": addr})
        self.poolmanager.pool_classes_by_scheme = {
            "http": type("PinnedHTTPPool", (HTTPConnectionPool,), {"ConnectionCls": http_conn}),
            "https": type("PinnedHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": https_conn}),
        }


@dataclass
class HttpClient:
    """Calls one service with (connect, read) timeouts; `headers` is called per request (fresh tokens)."""

    service: str
    connect_timeout_s: float
    read_timeout_s: float
    headers: Callable[[], Mapping[str, str]] = dict
    auth: tuple[str, str] | None = field(default=None, repr=False)
    retry_after_max_s: float = 10.0
    """Longest Retry-After honoured in-process; longer waits become DownstreamUnavailable."""
    max_throttle_retries: int = MAX_THROTTLE_RETRIES
    auth_hint: str = "check the credentials"
    """Said with a 401/403 (e.g. which settings to check)."""
    guard: Guard | None = None
    """With a guard: checked addresses only, no proxy from the environment, redirects manual."""
    follow_redirects: bool = True
    max_body_bytes: int | None = None
    """Read at most this much of an answer's body (+1 byte, so a caller sees it was cut)."""
    record: bool = False
    """Note each call's outcome in the list `calls_recorded()` opened (a job's `downstream`)."""
    sleep: Callable[[float], None] = time.sleep
    verify: str | bool | None = None
    """TLS verification of guarded calls: None (the default CA bundle), or a CA bundle's path."""
    _local: threading.local = field(default_factory=threading.local, repr=False)

    @property
    def session(self) -> requests.Session:
        """One session per thread (sync functions run in a thread pool)."""
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
        return session

    def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        data: bytes | str | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        allow: Collection[int] = (),
        read_timeout_s: float | None = None,
        need_s: float = 1.0,
        secret_headers: Collection[str] = (),
    ) -> requests.Response:
        """Send; return 2xx answers and statuses in `allow`; raise mapped errors otherwise.
        `need_s`: the least time left for the call to be made at all (else BudgetSpent).
        `secret_headers`: names of `headers` whose values are secrets: masked in any error's text,
        and (like Authorization, Proxy-Authorization and Cookie) not sent on to another origin."""
        named = {n.lower() for n in secret_headers}
        secrets = [v for k, v in (headers or {}).items() if k.lower() in named and v]
        throttled = 0
        while True:
            started = time.monotonic()
            try:
                timeout = self._timeouts(method, url, read_timeout_s or self.read_timeout_s, need_s)
                resp = self._send(method, url, json, data, params, headers, timeout, named)
            except Exception as exc:
                self._note(started, error=call_error(exc))
                raise
            code = int(resp.status_code)
            self._note(started, status=code)
            if 200 <= code < 300 or code in allow:
                return resp
            wait = retry_after_seconds(resp.headers.get("Retry-After"))
            if code == 429:
                pause = 1.0 if wait is None else wait
                left = remaining_budget()
                fits = left is None or pause + self.connect_timeout_s < left
                if throttled < self.max_throttle_retries and pause <= self.retry_after_max_s and fits:
                    throttled += 1
                    self.sleep(pause)
                    continue
            raise self.error_for(method, url, code, resp.text or "", wait, secrets)

    def _note(self, started: float, **outcome: Any) -> None:
        notes = _calls.get() if self.record else None
        if notes is not None and len(notes) < MAX_CALL_NOTES:
            notes.append({**outcome, "ms": round((time.monotonic() - started) * 1000)})

    def error_for(
        self, method: str, url: str, code: int, text: str, wait: float | None, secrets: Collection[str] = ()
    ) -> Exception:
        """The error an unwanted answer maps to (pure); `secrets` masked in the answer's start."""
        where = f"{method} {path_of(url)}"
        if code == 429:
            after = f", Retry-After {wait:g}s" if wait is not None else ""
            return DownstreamUnavailable(
                f"{self.service}: throttled (HTTP 429{after}) on {where}", retry_after_s=wait
            )
        detail = scrub(text, secrets=secrets)
        if transient_status(code):
            return DownstreamUnavailable(
                f"{self.service}: HTTP {code} on {where}: {detail}", retry_after_s=wait
            )
        if code in (401, 403):
            return DownstreamRejected(
                f"{self.service}: credentials rejected (HTTP {code}) on {where}; {self.auth_hint}: {detail}",
                status=code,
            )
        if 300 <= code < 400:
            return DownstreamRejected(
                f"{self.service}: HTTP {code} redirect on {where} not followed", status=code
            )
        return DownstreamRejected(f"{self.service}: HTTP {code} on {where}: {detail}", status=code)

    def _timeouts(self, method: str, url: str, read_s: float, need_s: float) -> tuple[float, float]:
        """(connect, read), cut to the budget; BudgetSpent when less than `need_s` is left."""
        left = remaining_budget()
        if left is None:
            return (self.connect_timeout_s, read_s)
        if left < max(need_s, 1.0):
            raise BudgetSpent(
                f"{self.service}: {max(0.0, left):.0f}s left in this invocation, {need_s:g}s needed; "
                f"{method} {path_of(url)} is left for the next check"
            )
        return (min(self.connect_timeout_s, left), min(read_s, left))

    def _send(
        self,
        method: str,
        url: str,
        body: Any,
        data: bytes | str | None,
        params: Mapping[str, Any] | None,
        extra: Mapping[str, str] | None,
        timeout: tuple[float, float],
        secret_headers: Collection[str] = (),
    ) -> requests.Response:
        """Send, following redirects by hand when guarded. Every message names the request as
        sent (`sent`), never a redirect's target: a `Location` is the downstream's text."""
        headers = {**self.headers(), **(extra or {})}
        PROPAGATOR.inject(headers)  # the job's trace goes with every outbound call (W3C traceparent)
        sent = f"{method} {path_of(url)}"
        carried: list[in_play.SecretUse] = []
        for hop in range(MAX_REDIRECTS + 1):
            if self.guard is not None:
                carried = self._check_secrets(url, hop, sent, carried, headers, body, data)
            session = self.session if self.guard is None else self._pinned_session(url, hop, sent)
            try:
                resp = session.request(
                    method,
                    url,
                    json=body,
                    data=data,
                    params=params,
                    headers=headers,
                    auth=self.auth,
                    timeout=timeout,
                    allow_redirects=self.guard is None and self.follow_redirects,
                    stream=self.max_body_bytes is not None,
                )
                if self.max_body_bytes is not None:
                    window = in_play.masker().window + 4096  # an echo across the cut is read whole
                    resp._content = (
                        resp.raw.read(self.max_body_bytes + 1 + window, decode_content=True) or b""
                    )
                    resp.close()
            except requests.exceptions.ReadTimeout as exc:
                raise ReadTimedOut(f"{self.service}: no answer within {timeout[1]:g}s on {sent}") from _bare(
                    exc
                )
            except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
                where = host_of(url) if hop == 0 else f"the target of a redirect of {sent}"
                raise DownstreamUnavailable(
                    f"{self.service}: cannot reach {where} ({exc.__class__.__name__})"
                ) from _bare(exc)
            except (requests.exceptions.RequestException, ValueError, UnicodeError) as exc:
                raise PermanentError(
                    f"{self.service}: bad request {sent} ({exc.__class__.__name__})"
                ) from None
            finally:
                if self.guard is not None:
                    session.close()
            location = resp.headers.get("Location")
            if self.guard is None or not self.follow_redirects or not resp.is_redirect or not location:
                return resp
            try:
                target = urljoin(url, location)
                destination(target)
            except (ValueError, UnicodeError):
                raise DownstreamRejected(
                    f"{self.service}: HTTP {resp.status_code} redirect on {sent} to an invalid location: not followed",
                    status=int(resp.status_code),
                ) from None
            if origin(target) != origin(url):  # credentials stay with the origin they were meant for
                dropped = CREDENTIAL_HEADERS | set(secret_headers)
                headers = {k: v for k, v in headers.items() if k.lower() not in dropped}
            url = target
            if resp.status_code in (301, 302, 303) and method != "HEAD":
                method, body, data, params = "GET", None, None, None
        raise DownstreamRejected(f"{self.service}: more than {MAX_REDIRECTS} redirects on {sent}", status=310)

    def _check_secrets(
        self,
        url: str,
        hop: int,
        sent: str,
        before: list[in_play.SecretUse],
        headers: Mapping[str, str],
        body: Any,
        data: bytes | str | None,
    ) -> list[in_play.SecretUse]:
        """The secrets in play this request carries, and those the first one carried (a redirect
        stays within their destinations even when it drops them): DestinationRefused when `url`
        is not a destination of one of them (shared/net/secrets.py)."""
        uses = in_play.uses()
        if not uses:
            return []
        dest = destination(url)
        texts = [*headers.values(), url]
        if data is not None:
            texts.append(data.decode("utf-8", "replace") if isinstance(data, bytes) else data)
        if body is not None:
            texts.append(jsonlib.dumps(body, ensure_ascii=False))
        carried = [*before, *(u for u in uses if u not in before and any(u.value in t for t in texts))]
        for secret in carried:
            if secret.destinations.allows(dest):
                continue
            if hop:
                raise DestinationRefused(
                    f"{self.service}: a redirect of {sent} would carry secret {secret.name} outside its "
                    f"destinations ({secret.name}_HOSTS): not followed"
                )
            raise DestinationRefused(
                f"{self.service}: secret {secret.name} may be sent only to its destinations "
                f"({secret.name}_HOSTS: {secret.destinations}); not to {dest}"
            )
        return carried

    def _pinned_session(self, url: str, hop: int = 0, sent: str = "") -> requests.Session:
        """A session for one call to `url`'s checked address (DestinationRefused: not allowed).
        A redirect's target is not named (it is the downstream's text)."""
        assert self.guard is not None
        try:
            address = self.guard.checked_address(url)
        except Refused as refused:
            if hop:
                raise DestinationRefused(
                    f"{self.service}: a redirect of {sent} was refused by the outbound guard "
                    f"({refusal_category(str(refused))}; the target is not shown: it came from the downstream)"
                ) from None
            raise DestinationRefused(f"{self.service}: {host_of(url)} refused: {refused}") from None
        except OSError as exc:
            where = host_of(url) if hop == 0 else f"the target of a redirect of {sent}"
            raise DownstreamUnavailable(
                f"{self.service}: cannot resolve {where} ({exc.__class__.__name__})"
            ) from None
        session = requests.Session()
        session.trust_env = False  # no proxy from the environment: the connection goes to `address`
        if self.verify is not None:
            session.verify = self.verify
        adapter = PinnedAdapter(address)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session


def json_body(resp: requests.Response, service: str) -> dict[str, Any]:
    """The answer as a JSON object, or DownstreamUnavailable when it is not one."""
    try:
        data = resp.json()
    except ValueError:
        raise DownstreamUnavailable(f"{service}: answer is not JSON (HTTP {resp.status_code})") from None
    if not isinstance(data, dict):
        raise DownstreamUnavailable(f"{service}: answer is not a JSON object (HTTP {resp.status_code})")
    return data


def _bare(exc: BaseException) -> Exception:
    """A cause without the request attached (requests exceptions can hold headers)."""
    return RuntimeError(exc.__class__.__name__)
