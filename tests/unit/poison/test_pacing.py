"""Pacing (shared/poison/pacing.py): a bulk step's size, pace and threads (pure)."""

from __future__ import annotations

from shared.poison.pacing import STEP_ITEMS, STEP_THREADS, Pacer, step_plan, step_threads


def test_a_step_takes_about_five_seconds_of_the_rate_and_waits_the_rest() -> None:
    assert step_plan(200).size == STEP_ITEMS == 1000
    assert step_plan(5).size == 25
    assert step_plan(5, done_in_s=0.2, items=5).delay_s == 1
    assert step_plan(50, done_in_s=3.0, items=50).delay_s == 0
    assert step_plan(0).size == STEP_ITEMS and step_plan(0, 1.0, 10).delay_s == 0


def test_a_step_starts_its_entries_at_the_rate_with_enough_in_flight() -> None:
    now = [100.0]
    slept: list[float] = []
    pacer = Pacer(200, clock=lambda: now[0])
    pacer.wait(0, sleep=slept.append)
    now[0] = 100.1
    pacer.wait(40, sleep=slept.append)  # due at 100.2
    pacer.wait(10, sleep=slept.append)  # due at 100.05: late, no wait
    assert [round(s, 3) for s in slept] == [0.1]
    Pacer(0, clock=lambda: now[0]).wait(10**6, sleep=slept.append)
    assert len(slept) == 1, "rate 0: no pacing"
    assert step_threads(200, 1000) == STEP_THREADS == 32 and step_threads(50, 250) == 13
    assert step_threads(2, 10) == 4 and step_threads(200, 3) == 3 and step_threads(0, 500) == STEP_THREADS
