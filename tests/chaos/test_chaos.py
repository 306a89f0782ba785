"""Chaos: no job lost, none applied twice, under kills, restarts, faults and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import ChaosConfig, run_chaos

pytestmark = pytest.mark.integration


@pytest.mark.timeout(900)
def test_chaos_short(tmp_path: Path) -> None:
    """Production timing (shipped host.json, default settings) with storage faults; only the
    killed host's message lease is 60 s instead of 600 s (still longer than the claim lease)."""
    cfg = ChaosConfig(jobs=300, kill_every_s=(1.5, 3.0), min_kills=5, timeout_s=600, host_lease_s=60)
    report = run_chaos(cfg, tmp_path)
    print("\n" + report.text())
    assert report.problems == []
    assert report.figures["kill -9 of a host (each restarted)"] >= 5
    assert report.figures["Azurite restarts (data on disk)"] == 1
    assert report.figures["duplicates suppressed (decision=duplicate)"] >= 1
    assert report.figures["ledger writes answered 503"] >= 1
    assert report.figures["ledger writes applied but unanswered"] >= 1


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_chaos_long(tmp_path: Path) -> None:
    report = run_chaos(ChaosConfig(jobs=2000, timeout_s=3000), tmp_path)  # the real 600-s host lease
    print("\n" + report.text())
    assert report.problems == []
