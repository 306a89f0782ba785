"""`noop`: does nothing and completes. A smoke test for a deployment, and the request-count baseline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.core.errors import PayloadError
from shared.jobs.base import Completed, JobContext, Outcome


class NoopHandler:
    def validate(self, payload: Mapping[str, Any]) -> None:
        if set(payload) - {"note"}:
            raise PayloadError([f"payload.{key}: unknown field" for key in sorted(set(payload) - {"note"})])

    def run(self, ctx: JobContext) -> Outcome:
        return Completed(result_ref="", summary={"note": str(ctx.payload.get("note", ""))[:200]})


HANDLER = NoopHandler()
