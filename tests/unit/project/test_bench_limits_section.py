"""bench/run.py's limits section: the figures it prints and the targets it checks (pure)."""

from __future__ import annotations

from typing import Any

from bench.run import format_limits


def report(
    permit: float = 2.0, max_in_flight: int = 4, ratio: float = 1.1, p95: float = 0.6
) -> dict[str, Any]:
    return {
        "report": {
            "limit": 4,
            "hosts": 2,
            "cost": {
                "permit_requests_per_job": permit,
                "target_permit_requests_per_job": 2,
                "requests_per_job_two_instances_alternating": 4.0,
            },
            "throughput": {
                "jobs": 40,
                "call_s": 1.0,
                "max_in_flight": max_in_flight,
                "seconds_to_last_call_end": 11.0,
                "ideal_s": 10.0,
                "ratio_to_ideal": ratio,
                "target_ratio": 1.25,
                "start_after_end_p50_s": 0.3,
                "start_after_end_p95_s": p95,
            },
            "faults": {
                "freeze_s": 90.0,
                "max_in_flight": max_in_flight,
                "seconds_to_4_in_flight_after_kill": 31.0,
                "seconds_to_4_in_flight_after_sigstop": 32.5,
                "target_s": 60,
                "completed": 120,
                "jobs": 120,
                "jobs_called_more_than_once": 0,
            },
        }
    }


def test_the_section_prints_each_figure_against_its_target() -> None:
    text = "\n".join(format_limits(report()))
    assert "MISSED" not in text
    assert "most in flight 4 (ok)" in text and "1.1x the ideal 10 s" in text and "p95 0.6 s" in text
    assert "4 in flight again after 31.0 s and 32.5 s (target <= 60: ok)" in text
    for bad in (report(permit=3.0), report(max_in_flight=5), report(ratio=1.3), report(p95=1.2)):
        assert "MISSED" in "\n".join(format_limits(bad))


def test_a_failed_run_says_so() -> None:
    assert "FAILED (timed out)" in "\n".join(format_limits({"error": "timed out"}))
