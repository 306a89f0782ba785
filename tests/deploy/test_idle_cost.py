"""The sweep_poison schedule lets an idle Flex Consumption app scale to zero, and the idle cost
figures in docs/deploy.md are the ones this schedule, host.json and the template give.

The figures are computed, not measured: see docs/deploy.md ("What an idle deployment costs") for the
assumptions, which are the constants below.
"""

from __future__ import annotations

import importlib
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.functions.decorators.timer import TimerTrigger

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from devhost.timers import parse_schedule  # noqa: E402
from shared.config.settings import parse_timespan  # noqa: E402
from tests.deploy.infra_support import watched_queues  # noqa: E402

OLD_SCHEDULE = "*/30 * * * * *"
AWAKE_AFTER_RUN_S = 60  # assumed idle period before Flex scales an instance in (upper bound)
QUEUE_PRICE_PER_10K = 0.004  # USD, queue Class 2 operations (GetMessages on an empty queue)
GB_S_PRICE = 0.000026  # USD, Flex Consumption on demand
FREE_GB_S = 100_000  # per subscription and month
MIN_BILLED_S = 1.0  # per execution
MONTH_H = 30 * 24
DEPLOY_DOC = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")


def runs_per_day(schedule: str) -> int:
    parsed = parse_schedule(schedule)
    start = datetime(2026, 1, 5, tzinfo=UTC)
    moment, runs = start - timedelta(microseconds=1), 0
    while (moment := parsed.next_after(moment)) < start + timedelta(days=1):
        runs += 1
    return runs


def polls_per_second(queues: int) -> float:
    """An awake host's polls of `queues` empty queues, each every maxPollingInterval."""
    options = json.loads((ROOT / "host.json").read_text(encoding="utf-8"))["extensions"]["queues"]
    return queues / parse_timespan(options["maxPollingInterval"])


def instance_gb() -> float:
    template = json.loads((ROOT / "infra" / "main.json").read_text(encoding="utf-8"))
    return float(template["parameters"]["instanceMemoryMB"]["defaultValue"]) / 1024


def queue_triggers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues the app's queue-triggered functions watch (each polled while an instance is awake)."""
    return watched_queues(monkeypatch)


def sweep_schedule(monkeypatch: pytest.MonkeyPatch, value: str | None) -> str:
    if value is None:
        monkeypatch.delenv("POISON_SWEEP_SCHEDULE", raising=False)
    else:
        monkeypatch.setenv("POISON_SWEEP_SCHEDULE", value)
    import function_app

    function_app = importlib.reload(function_app)
    [sweep] = [f for f in function_app.app.get_functions() if f.get_function_name() == "sweep_poison"]
    trigger = sweep.get_trigger()
    assert isinstance(trigger, TimerTrigger)
    schedule: str = trigger.schedule
    return schedule


def test_azure_sweeps_every_15_minutes_and_the_local_stack_every_30_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schedule = sweep_schedule(monkeypatch, None)
    assert schedule == "0 */15 * * * *"
    assert runs_per_day(schedule) == 96
    # the gap between runs is far longer than an instance stays awake: it scales to zero in between
    assert 24 * 3600 / runs_per_day(schedule) > 10 * AWAKE_AFTER_RUN_S
    local = json.loads((ROOT / "local.settings.sample.json").read_text(encoding="utf-8"))["Values"]
    assert local["POISON_SWEEP_SCHEDULE"] == OLD_SCHEDULE
    assert sweep_schedule(monkeypatch, OLD_SCHEDULE) == OLD_SCHEDULE
    template = (ROOT / "infra" / "main.json").read_text(encoding="utf-8")
    assert "POISON_SWEEP_SCHEDULE" not in template, "Azure uses the code's default"


def _money(value: float) -> str:
    return f"${value:.2f}"


def test_documented_idle_cost_matches_the_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    gb = instance_gb()
    queues = queue_triggers(monkeypatch)
    assert queues == ["jobs", "jobs-ops", "jobs-poison"]
    rate = polls_per_second(len(queues))
    assert (gb, rate) == (2.0, 30.0)  # maxPollingInterval 100 ms: pickup within ~100 ms (issue 22)

    # before: a run every 30 s keeps the instance awake all the time
    old_runs = runs_per_day(OLD_SCHEDULE) * 30
    assert 24 * 3600 / runs_per_day(OLD_SCHEDULE) < AWAKE_AFTER_RUN_S
    old_polls = rate * 3600 * MONTH_H
    old_gb_s = old_runs * MIN_BILLED_S * gb
    figures = {
        f"{old_runs:,}": "runs a month, before",
        f"{rate * 3600:,.0f} an hour, {old_polls:,.0f}": "polls, before",
        _money(old_polls / 10_000 * QUEUE_PRICE_PER_10K): "polls cost, before",
        f"{old_gb_s:,.0f} GB-s": "compute, before",
        _money((old_gb_s - FREE_GB_S) * GB_S_PRICE): "compute beyond the grant, before",
    }

    # now
    new_runs = runs_per_day(sweep_schedule(monkeypatch, None)) * 30
    awake_h = new_runs * AWAKE_AFTER_RUN_S / 3600
    new_polls = new_runs * AWAKE_AFTER_RUN_S * rate
    new_gb_s = new_runs * MIN_BILLED_S * gb
    figures |= {
        f"{new_runs:,}": "runs a month, now",
        f"{awake_h:.0f} hours a month ({awake_h / MONTH_H:.1%})": "awake, now",
        f"at most {AWAKE_AFTER_RUN_S * rate:,.0f} per run, {new_polls:,.0f}": "polls, now",
        _money(new_polls / 10_000 * QUEUE_PRICE_PER_10K): "polls cost, now",
        f"{new_gb_s:,.0f} GB-s, inside the free grant ({new_gb_s / FREE_GB_S:.1%} of it; "
        f"{_money(new_gb_s * GB_S_PRICE)} at list price)": "compute, now",
    }
    missing = {text: what for text, what in figures.items() if text not in DEPLOY_DOC}
    assert not missing, missing
    assert new_gb_s < FREE_GB_S < old_gb_s
