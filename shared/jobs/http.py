"""`http`: the Async Caller. Calls the URL in the payload and keeps the answer as the job's result.

- Every call sends `Idempotency-Key: <ctx.idempotency_key()>`: the same on every retry,
  redelivery, recovery and plain replay of the job (a new one after an edited replay), so the
  downstream can tell a repeat from a new request.
- 5xx, 408, 429, connection errors and timeouts are transient: retried later by the kind's retry
  policy (jittered exponential backoff; an answer's Retry-After honoured up to the cap). Other
  4xx are poisoned at once, the status and the start of the answer in the reason.
- The outbound guard (shared/net/guard.py) refuses loopback, private, link-local, the app's own
  storage and plain http:// unless the destination is in `HTTP_ALLOWED_HOSTS`: at POST for a
  literal address (400), else on the resolved address before connecting (poisoned, nothing sent).
- Secret headers (`{"secret": "HTTP_SECRET_..."}`) are read from the app settings at call time
  and go only to the setting's destinations (`HTTP_SECRET_<NAME>_HOSTS`: checked at POST and at
  every call and redirect); the ledger, archive and result hold only the setting's name, and an
  echo of the value (any usual encoding) is masked in the result, reason, history and logs.
- The result (`<results>/<id>.json`): `status`, selected `headers`, the `body` (JSON when the
  answer is JSON, else text; bodies over `HTTP_INLINE_BODY_BYTES` are in `<id>.body` beside it,
  named by `body_ref`), `attempts`, `duration_s`. Each attempt's downstream status (or timeout,
  connection error) is noted in the ledger record's `downstream` by the write that ends the
  attempt, and shown on the job's console page. Happy path storage requests: claim, result,
  complete (+ the jobs index's write).
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import requests

from shared.config.settings import Settings
from shared.core.errors import NotAvailable
from shared.core.setting_reader import SettingReader
from shared.jobs.base import Completed, JobContext, Outcome
from shared.jobs.http_payload import HttpCall, HttpKindSettings, parse_call, read_settings
from shared.jobs.outbound import secret_destinations
from shared.net import secrets as in_play
from shared.net.client import HttpClient
from shared.net.guard import Guard, Resolver, resolve
from shared.permits.limit import Limit
from shared.permits.limit_settings import HostLimits, read_host_limits

KIND: Final = "http"
RESULT_HEADERS = (
    "content-type",
    "content-length",
    "location",
    "etag",
    "retry-after",
    "x-request-id",
    "request-id",
)
"""The answer's headers kept in the result."""


class HttpHandler:
    """The `http` kind; `configure` binds it to the deployment's settings."""

    settings_prefix = "HTTP_"

    def __init__(
        self,
        config: HttpKindSettings | None = None,
        resolver: Resolver = resolve,
        verify: str | None = None,
        host_limits: HostLimits | None = None,
    ) -> None:
        self.resolver = resolver
        """How host names are resolved for the guard (tests give their own)."""
        self.verify = verify
        """A CA bundle to verify TLS with instead of the default one (tests' own CA)."""
        self.config = config or HttpKindSettings(guard=Guard(resolver=resolver))
        self.host_limits = host_limits or HostLimits()
        """`HTTP_MAX_CONCURRENT_PER_HOST`, `HTTP_MAX_PER_SECOND_PER_HOST`, `HTTP_LIMITS_PER_HOST`."""

    def configure(self, reader: SettingReader, settings: Settings) -> HttpHandler:
        config = read_settings(reader, settings, self.resolver)
        return HttpHandler(config, self.resolver, self.verify, read_host_limits(reader, self.settings_prefix))

    def validate(self, payload: Mapping[str, Any]) -> None:
        parse_call(payload, self.config)

    @property
    def limited(self) -> bool:
        """Whether any host is limited (else no job of this kind ever waits)."""
        return self.host_limits.any()

    def limits(self, payload: Mapping[str, Any]) -> list[Limit]:
        """The destination host's limit, if it has one (pure)."""
        host = urlsplit(parse_call(payload, self.config).url).hostname or ""
        limit = self.host_limits.for_host(host)
        return [limit] if limit is not None else []

    def run(self, ctx: JobContext) -> Outcome:
        call = parse_call(ctx.payload, self.config)
        headers = secret_headers(call, ctx.settings.source)
        hidden = [name for name, value in call.headers.items() if not isinstance(value, str)]
        headers["Idempotency-Key"] = ctx.idempotency_key()
        client = HttpClient(
            KIND,
            self.config.connect_timeout_s,
            call.wait_s,
            guard=self.config.guard,
            follow_redirects=self.config.follow_redirects,
            max_throttle_retries=0,  # a 429 is retried by the queue, after its Retry-After
            max_body_bytes=self.config.max_body_bytes,
            record=True,  # each attempt's status goes into the ledger's `downstream` (the console shows it)
            verify=self.verify,
        )
        ctx.fence()  # the call is made only while the host's permit is provably held
        started = time.monotonic()
        try:
            resp = client.request(
                call.method,
                call.url,
                json=call.body if call.has_body and not isinstance(call.body, str) else None,
                data=call.body.encode() if isinstance(call.body, str) else None,
                headers=headers,
                need_s=call.wait_s + self.config.connect_timeout_s,
                secret_headers=hidden,  # masked in errors, never sent on to another origin
            )
        finally:
            ctx.release_permits()  # the call is over: the host's next job may start meanwhile
        duration = time.monotonic() - started
        ctx.log.info(
            "http: %s %s answered %s in %.3fs", call.method, _where(call.url), resp.status_code, duration
        )
        return write_result(ctx, resp, self.config, duration, [headers[name] for name in hidden])


def secret_headers(call: HttpCall, source: Mapping[str, str]) -> dict[str, str]:
    """The request's headers, secrets read from the app settings now (NotAvailable when unset),
    each noted as in play with its destinations (enforced and masked: shared/net/secrets.py)."""
    out: dict[str, str] = {}
    for name, value in call.headers.items():
        if isinstance(value, str):
            out[name] = value
            continue
        setting = value["secret"]
        secret = source.get(setting, "").strip()
        if not secret:
            raise NotAvailable(f"header {name}: app setting {setting} is not set (replay once it is)")
        out[name] = in_play.use(setting, secret, secret_destinations(source, setting))
    return out


def result_document(
    ctx: JobContext,
    resp: requests.Response,
    config: HttpKindSettings,
    duration_s: float,
    secrets: Collection[str] = (),
) -> tuple[dict[str, Any], bytes | None]:
    """The result document, and the body bytes to store beside it when too large to inline (pure).
    A secret the answer echoes (body or kept headers, in any usual encoding) is masked, the whole
    body read (the cut plus a window) masked before it is cut, and the decoded JSON masked again."""
    masker = in_play.masker().with_(secrets)
    raw = resp.content or b""
    truncated = len(raw) > config.max_body_bytes
    content = masker.bytes(raw)[: config.max_body_bytes]
    doc: dict[str, Any] = {
        "id": ctx.job_id,
        "status": int(resp.status_code),
        "headers": {
            k: masker.text(v) for k, v in ((h, resp.headers.get(h)) for h in RESULT_HEADERS) if v is not None
        },
        "attempts": ctx.attempt + 1,
        "duration_s": round(duration_s, 3),
        "body_bytes": len(content),
    }
    if truncated:
        doc["body_truncated"] = True
    if len(content) > config.inline_body_bytes:
        doc["body_ref"] = f"{ctx.settings.results_container}/{ctx.job_id}.body"
        return doc, content
    kind = (resp.headers.get("content-type") or "").split(";")[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        try:
            doc["body"] = masker.value(json.loads(content))
            return doc, None
        except (ValueError, UnicodeDecodeError):
            pass
    doc["body"] = masker.text(content.decode("utf-8", errors="replace"))
    return doc, None


def write_result(
    ctx: JobContext,
    resp: requests.Response,
    config: HttpKindSettings,
    duration_s: float,
    secrets: Collection[str] = (),
) -> Completed:
    """Upload the result (and a large body first) to the results container."""
    doc, spill = result_document(ctx, resp, config, duration_s, secrets)
    results = ctx.storage.blobs(ctx.settings.results_container)
    if spill is not None:
        body_type = resp.headers.get("content-type") or "application/octet-stream"
        results.write(f"{ctx.job_id}.body", spill, content_type=body_type)
    name = f"{ctx.job_id}.json"
    results.write(
        name, json.dumps(doc, ensure_ascii=False).encode(), content_type="application/json; charset=utf-8"
    )
    summary = {"status": doc["status"], "attempts": doc["attempts"], "duration_s": doc["duration_s"]}
    return Completed(result_ref=f"{ctx.settings.results_container}/{name}", summary=summary)


def _where(url: str) -> str:
    """The URL for logs: scheme, host and path (the query may carry tokens)."""
    return url.split("?")[0].split("#")[0]


HANDLER = HttpHandler()
