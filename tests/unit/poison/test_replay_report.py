"""A replay's report: every skip says why (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shared.poison.replay import ReplayReport, expiry_refusal


def test_every_skip_says_why_and_an_expired_job_points_to_the_editor() -> None:
    now = datetime(2026, 11, 25, tzinfo=UTC)
    assert expiry_refusal(None, now) == "" and expiry_refusal(now + timedelta(seconds=1), now) == ""
    assert "extend expires_at in the job's editor" in expiry_refusal(now, now)
    report = ReplayReport()
    report.add("a", "replayed")
    report.add("b", "skipped_completed")
    report.add("c", "skipped_invalid", "expired at X")
    report.add("d", "not_found")
    assert report.as_dict()["reasons"] == {
        "b": "the job completed meanwhile",
        "c": "expired at X",
        "d": "no listed poison archive entry for this job",
    }
    assert report.replayed == ["a"] and report.skipped_invalid == ["c"]
