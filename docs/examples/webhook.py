"""`webhook`: POST the payload's `body` to its `url`, once per job (docs/handlers.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shared.config.settings import Settings
from shared.core.errors import PayloadError
from shared.core.setting_reader import SettingReader
from shared.jobs.base import Completed, JobContext, Outcome
from shared.jobs.outbound import OutboundPolicy, read_outbound
from shared.net.client import HttpClient


class WebhookHandler:
    """5xx, 408, 429 and timeouts: retried later; other 4xx: poisoned; the answer is the result."""

    settings_prefix = "WEBHOOK_"

    def __init__(self, outbound: OutboundPolicy | None = None, timeout_s: float = 10.0) -> None:
        self.guard = (outbound or OutboundPolicy("WEBHOOK_")).guard()  # WEBHOOK_ALLOWED_HOSTS
        self.timeout_s = timeout_s

    def configure(self, reader: SettingReader, settings: Settings) -> WebhookHandler:
        timeout_s = reader.number("WEBHOOK_TIMEOUT_SECONDS", 10.0, 1.0)
        return WebhookHandler(read_outbound(reader, "WEBHOOK_"), timeout_s)

    def validate(self, payload: Mapping[str, Any]) -> None:
        problems = [f"payload.{k}: unknown field" for k in sorted(set(payload) - {"url", "body"})]
        url = payload.get("url")
        if not isinstance(url, str):
            problems.append("payload.url: required, a URL")
        elif refusal := self.guard.url_refusal(url):
            problems.append(f"payload.url: {refusal}")
        if problems:
            raise PayloadError(problems)

    def run(self, ctx: JobContext) -> Outcome:
        client = HttpClient(
            "webhook", 5, self.timeout_s, guard=self.guard, max_throttle_retries=0, record=True
        )

        def post() -> dict[str, Any]:
            resp = client.request(
                "POST",
                ctx.payload["url"],
                json=ctx.payload.get("body"),
                headers={"Idempotency-Key": ctx.idempotency_key()},
            )
            return {"status": resp.status_code, "answer": resp.text[:200]}

        answer = ctx.effect("post", post)  # recorded: a later run of this job does not post again
        name = f"{ctx.job_id}.json"
        ctx.storage.blobs(ctx.settings.results_container).write(name, json.dumps(answer))
        return Completed(result_ref=f"{ctx.settings.results_container}/{name}", summary=answer)
