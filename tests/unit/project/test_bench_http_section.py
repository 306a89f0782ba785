"""bench/run.py's http-kind section: the figures it prints and the target it checks (pure)."""

from __future__ import annotations

from bench.run import format_http


def report(per_job: float) -> dict[str, object]:
    return {
        "report": {
            "jobs": 300,
            "downstream_latency_s": 0.05,
            "jobs_per_s": 41.2,
            "seconds": 7.3,
            "calls": 300,
            "keys_sent_more_than_once": 0,
            "storage_requests_per_job_besides_queue": per_job,
            "target_storage_requests_per_job": 4,
            "requests": {"requests_per_message": per_job + 1.031},
        }
    }


def test_the_section_prints_jobs_per_second_and_requests_against_the_target() -> None:
    text = "\n".join(format_http(report(4.0)))
    assert "41.2 jobs/s" in text and "50 ms" in text and "keys sent more than once: 0" in text
    assert "4.0 (target <= 4, to 2 decimals: ok)" in text
    assert "to 2 decimals: ok)" in "\n".join(format_http(report(4.003)))  # one stray request in 300 jobs
    assert "MISSED" in "\n".join(format_http(report(4.01)))
    assert "MISSED" in "\n".join(format_http(report(4.2)))


def test_a_failed_run_says_so() -> None:
    assert "FAILED (timed out)" in "\n".join(format_http({"error": "timed out"}))


def test_sections_7_to_10_without_a_report_say_failed_and_why() -> None:
    from bench.run import format_fairness, format_limits, format_versus

    for fmt in (format_http, format_versus, format_limits, format_fairness):
        assert "FAILED (timed out after 1800s)" in "\n".join(fmt({"error": "timed out after 1800s"}))
        assert "FAILED (exit code 2)" in "\n".join(fmt({"exit_code": 2, "stdout": ""}))
        assert "FAILED (bench/x.py is not there)" in "\n".join(fmt({"skipped": "bench/x.py is not there"}))
    printed = format_versus({"exit_code": 0, "report": {}, "stdout": "20 MB: app 1.0 s\n"})
    assert printed[-1] == "   20 MB: app 1.0 s", "a run without its JSON shows what it printed"
