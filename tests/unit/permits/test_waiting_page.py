"""The console's job page says why a job waits for a permit (the reason as the API gives it)."""

from __future__ import annotations

from shared.interfaces.console.pages import job_page
from shared.interfaces.console.queries import JobView

REASON = "waiting for a permit of http:api.partner.example: 4 of 4 held by a, b, c, d"


def test_the_job_page_says_why_a_job_waits_and_escapes_it() -> None:
    record = {"id": "j", "kind": "http", "status": "queued"}
    waiting = {"key": "http:api.partner.example", "reason": REASON + " <x>", "held": 4, "max_concurrent": 4}
    html = job_page(JobView(record, [], None, None, {}, "", [], waiting=waiting), "/b", "j")
    assert f"<p id=waiting class=muted>{REASON} &lt;x&gt;</p>" in html
    assert "id=waiting" not in job_page(JobView(record, [], None, None, {}, "", []), "/b", "j")
