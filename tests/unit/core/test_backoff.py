"""The retry delay: exponential ceiling, full jitter, whole seconds."""

from __future__ import annotations

import random

import pytest

from shared.core.backoff import backoff_ceiling, poll_delay, retry_delay


def test_ceiling_doubles_then_caps() -> None:
    assert [backoff_ceiling(a, 2, 30) for a in range(1, 7)] == [2, 4, 8, 16, 30, 30]


def test_ceiling_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError):
        backoff_ceiling(0, 1, 10)


def test_full_jitter_spans_one_to_ceiling() -> None:
    assert retry_delay(4, 2, 300, rand=lambda: 0.0) == 1
    assert retry_delay(4, 2, 300, rand=lambda: 0.999999) == 16
    rng = random.Random(7)
    delays = [retry_delay(6, 2, 300, rand=rng.random) for _ in range(2000)]
    assert min(delays) >= 1 and max(delays) <= 64
    assert len(set(delays)) > 40  # jittered, not fixed
    mean = sum(delays) / len(delays)
    assert 28 < mean < 36  # uniform on [0, 64] rounded, floor 1


def test_jittered_delays_grow_on_average() -> None:
    rng = random.Random(1)
    means = [sum(retry_delay(a, 2, 300, rand=rng.random) for _ in range(500)) / 500 for a in (1, 3, 5)]
    assert means[0] < means[1] < means[2]


def test_huge_attempt_does_not_overflow() -> None:
    assert retry_delay(10_000, 2, 300, rand=lambda: 0.5) == 150


def test_poll_delay_grows_and_caps() -> None:
    assert [poll_delay(n, 10, 300) for n in range(6)] == [10, 20, 40, 80, 160, 300]
