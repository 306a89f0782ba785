"""`notify`: fan an event out to up to 5 subscribers, each call signed, each delivered once (docs/handlers.md)."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from functools import partial
from typing import Any

from shared.config.settings import Settings
from shared.core.errors import DownstreamUnavailable, PayloadError
from shared.core.setting_reader import SettingReader
from shared.jobs.base import Completed, JobContext, Outcome
from shared.jobs.outbound import OutboundPolicy, read_outbound
from shared.net.client import HttpClient

MAX_SUBSCRIBERS = 5


class NotifyHandler:
    """POSTs the event to each subscriber with `X-Signature: sha256=<HMAC-SHA256 of the body>`,
    keyed by the secret NOTIFY_SECRET_SIGNING. A subscriber's 5xx is retried for that subscriber
    only (the delivered ones are recorded effects); a 4xx poisons the job."""

    settings_prefix = "NOTIFY_"

    def __init__(self, outbound: OutboundPolicy | None = None, timeout_s: float = 10.0) -> None:
        self.guard = (outbound or OutboundPolicy("NOTIFY_")).guard()  # refusals name NOTIFY_ALLOWED_HOSTS
        self.timeout_s = timeout_s

    def configure(self, reader: SettingReader, settings: Settings) -> NotifyHandler:
        timeout_s = reader.number("NOTIFY_TIMEOUT_SECONDS", 10.0, 1.0)
        return NotifyHandler(read_outbound(reader, "NOTIFY_"), timeout_s)

    def validate(self, payload: Mapping[str, Any]) -> None:
        problems = [f"payload.{k}: unknown field" for k in sorted(set(payload) - {"event", "subscribers"})]
        if not isinstance(payload.get("event"), dict):
            problems.append("payload.event: required, an object")
        subscribers = payload.get("subscribers")
        if not isinstance(subscribers, list) or not 1 <= len(subscribers) <= MAX_SUBSCRIBERS:
            problems.append(f"payload.subscribers: a list of 1 to {MAX_SUBSCRIBERS} URLs")
            subscribers = []
        for i, url in enumerate(subscribers):
            refusal = self.guard.url_refusal(url) if isinstance(url, str) else "a URL"
            if refusal:
                problems.append(f"payload.subscribers[{i}]: {refusal}")
        if problems:
            raise PayloadError(problems)

    def run(self, ctx: JobContext) -> Outcome:
        body = json.dumps(ctx.payload["event"], sort_keys=True).encode()
        signature = hmac.new(ctx.secret("SIGNING").encode(), body, hashlib.sha256).hexdigest()
        client = HttpClient(
            "notify", 5, self.timeout_s, guard=self.guard, max_throttle_retries=0, record=True
        )
        later: list[DownstreamUnavailable] = []
        for i, url in enumerate(ctx.payload["subscribers"]):
            headers = {
                "Content-Type": "application/json",
                "X-Signature": f"sha256={signature}",
                "Idempotency-Key": ctx.idempotency_key(f"subscriber-{i}"),
            }
            try:  # recorded once it answers 2xx: a later run of this job does not call it again
                ctx.effect(f"subscriber-{i}", partial(deliver, client, url, body, headers))
            except DownstreamUnavailable as exc:  # the others are still tried now
                later.append(exc)
        if later:
            raise later[0]  # retried: only the subscribers not yet delivered are called
        return Completed("", {"delivered": len(ctx.payload["subscribers"])})


def deliver(client: HttpClient, url: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    return {"status": client.request("POST", url, data=body, headers=headers).status_code}
