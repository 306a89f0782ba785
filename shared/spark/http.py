"""One HTTP call to a submission API: explicit timeouts, bounded 429 handling, error mapping.

Errors map to shared.core.errors: connection failures, read timeouts, 429 and 5xx are transient
(`DownstreamUnavailable`; a read timeout is the subclass `ReadTimedOut` because the server may
have acted on the request); other 4xx are configuration problems (`PermanentError`).
Messages never carry request headers, and server text is scrubbed of anything token-like.
"""

from __future__ import annotations

import contextlib
import contextvars
import email.utils
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import requests
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.core.errors import DownstreamUnavailable, PermanentError
from shared.spark.config import MAX_THROTTLE_RETRIES, BackendOptions, SparkSettings

PROPAGATOR = TraceContextTextMapPropagator()

_SECRETS = re.compile(
    r"(Bearer\s+)[A-Za-z0-9._~+/=-]+"
    r"|((?:AccountKey|SharedAccessSignature|password|secret|token|sig)\s*[=:]\s*\"?)[^;&\s\"]+"
    r"|(dapi)[0-9a-f]{16,}"
    r"|(eyJ)[A-Za-z0-9._-]{20,}",
    re.IGNORECASE,
)


class ReadTimedOut(DownstreamUnavailable):
    """No answer within the read timeout: the server may have acted on the request."""


class BudgetSpent(DownstreamUnavailable):
    """This invocation's time for Spark calls is used up: the call was not made (check later)."""


_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("spark_step_deadline", default=None)


@contextlib.contextmanager
def step_budget(seconds: float, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """Every HTTP call made inside ends within `seconds` from now (SPARK_STEP_BUDGET_SECONDS):
    timeouts are cut to what is left, and a call (or a Retry-After wait) that cannot fit is not
    made (`BudgetSpent`). Nested budgets keep the earlier deadline."""
    outer = _deadline.get()
    mine = clock() + seconds
    token = _deadline.set(mine if outer is None else min(outer, mine))
    try:
        yield
    finally:
        _deadline.reset(token)


def remaining_budget(clock: Callable[[], float] = time.monotonic) -> float | None:
    """Seconds left in the current step budget (None: no budget set)."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - clock()


def scrub(text: str, limit: int = 400) -> str:
    """Server text safe for logs and errors: secrets masked, length bounded."""
    masked = _SECRETS.sub(
        lambda m: (m.group(1) or m.group(2) or m.group(3) or m.group(4) or "") + "***", text
    )
    return masked if len(masked) <= limit else masked[:limit] + "..."


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


@dataclass
class HttpClient:
    """Calls one API with (connect, read) timeouts; `headers` is called per request (fresh tokens)."""

    backend: str
    connect_timeout_s: float
    read_timeout_s: float
    headers: Callable[[], Mapping[str, str]] = dict
    auth: tuple[str, str] | None = field(default=None, repr=False)
    retry_after_max_s: float = 10.0
    """Longest Retry-After honoured in-process; longer waits become DownstreamUnavailable."""
    max_throttle_retries: int = MAX_THROTTLE_RETRIES
    sleep: Callable[[float], None] = time.sleep
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
        params: Mapping[str, Any] | None = None,
        allow: Collection[int] = (),
        read_timeout_s: float | None = None,
    ) -> requests.Response:
        """Send; return 2xx answers and statuses in `allow`; raise mapped errors otherwise."""
        throttled = 0
        while True:
            timeout = self._timeouts(method, url, read_timeout_s or self.read_timeout_s)
            resp = self._send(method, url, json, params, timeout)
            code = int(resp.status_code)
            if 200 <= code < 300 or code in allow:
                return resp
            if code == 429:
                wait = retry_after_seconds(resp.headers.get("Retry-After"))
                wait = 1.0 if wait is None else wait
                left = remaining_budget()
                fits = left is None or wait + self.connect_timeout_s < left
                if throttled < self.max_throttle_retries and wait <= self.retry_after_max_s and fits:
                    throttled += 1
                    self.sleep(wait)
                    continue
                raise DownstreamUnavailable(
                    f"{self.backend}: throttled (HTTP 429, Retry-After {wait:g}s) on {method} {_path(url)}"
                )
            detail = scrub(resp.text or "")
            if code >= 500:
                raise DownstreamUnavailable(f"{self.backend}: HTTP {code} on {method} {_path(url)}: {detail}")
            if code in (401, 403):
                raise PermanentError(
                    f"{self.backend}: credentials rejected (HTTP {code}) on {method} {_path(url)}; "
                    f"check the SPARK_* auth settings and the identity's role: {detail}"
                )
            raise PermanentError(f"{self.backend}: HTTP {code} on {method} {_path(url)}: {detail}")

    def _timeouts(self, method: str, url: str, read_s: float) -> tuple[float, float]:
        """(connect, read), cut to the step budget; BudgetSpent when too little is left to try."""
        left = remaining_budget()
        if left is None:
            return (self.connect_timeout_s, read_s)
        if left < 1.0:
            raise BudgetSpent(
                f"{self.backend}: this invocation's time for Spark calls is spent; "
                f"{method} {_path(url)} is left for the next check"
            )
        return (min(self.connect_timeout_s, left), min(read_s, left))

    def _send(
        self, method: str, url: str, body: Any, params: Mapping[str, Any] | None, timeout: tuple[float, float]
    ) -> requests.Response:
        try:
            return self.session.request(
                method,
                url,
                json=body,
                params=params,
                headers=with_trace_context(dict(self.headers())),
                auth=self.auth,
                timeout=timeout,
            )
        except requests.exceptions.ReadTimeout as exc:
            raise ReadTimedOut(
                f"{self.backend}: no answer within {timeout[1]:g}s on {method} {_path(url)}"
            ) from _bare(exc)
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            raise DownstreamUnavailable(
                f"{self.backend}: cannot reach {_host(url)} ({exc.__class__.__name__})"
            ) from _bare(exc)
        except requests.exceptions.RequestException as exc:
            raise PermanentError(
                f"{self.backend}: bad request to {_path(url)} ({exc.__class__.__name__})"
            ) from None


def with_trace_context(headers: dict[str, str]) -> dict[str, str]:
    """Outbound headers with the current span's `traceparent` / `tracestate` (issue 36)."""
    PROPAGATOR.inject(headers)
    return headers


def json_body(resp: requests.Response, backend: str) -> dict[str, Any]:
    """The answer as a JSON object, or DownstreamUnavailable when it is not one."""
    try:
        data = resp.json()
    except ValueError:
        raise DownstreamUnavailable(f"{backend}: answer is not JSON (HTTP {resp.status_code})") from None
    if not isinstance(data, dict):
        raise DownstreamUnavailable(f"{backend}: answer is not a JSON object (HTTP {resp.status_code})")
    return data


def _bare(exc: BaseException) -> Exception:
    """A cause without the request attached (requests exceptions can hold headers)."""
    return RuntimeError(exc.__class__.__name__)


def _host(url: str) -> str:
    return re.sub(r"^(\w+://[^/?#]+).*$", r"\1", url)


def _path(url: str) -> str:
    return re.sub(r"^\w+://[^/?#]+", "", url).split("?")[0] or "/"


OptionsT = TypeVar("OptionsT", bound=BackendOptions)


def own_options(spark: SparkSettings, kind: type[OptionsT], backend: str) -> OptionsT:
    """The backend's own settings; PermanentError when they were read for another backend."""
    if not isinstance(spark.options, kind):
        raise PermanentError(f"{backend}: settings were not read for SPARK_BACKEND={backend}")
    return spark.options


def client_for(
    backend: str,
    spark: SparkSettings,
    headers: Callable[[], Mapping[str, str]],
    auth: tuple[str, str] | None = None,
) -> HttpClient:
    """The backend's HTTP client, with the timeouts and Retry-After cap every backend shares."""
    return HttpClient(
        backend,
        spark.connect_timeout_s,
        spark.read_timeout_s,
        headers=headers,
        auth=auth,
        retry_after_max_s=spark.retry_after_max_s,
    )
