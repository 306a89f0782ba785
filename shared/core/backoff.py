"""Pure retry-delay function: exponential backoff with full jitter."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass


def backoff_ceiling(attempt: int, base_s: float, cap_s: float) -> float:
    """The largest delay for a retry after `attempt` failures (attempt >= 1): base * 2^(attempt-1), capped."""
    if attempt < 1:
        raise ValueError("attempt must be >= 1")
    return min(cap_s, base_s * (2.0 ** min(attempt - 1, 62)))


def retry_delay(attempt: int, base_s: float, cap_s: float, rand: Callable[[], float] = random.random) -> int:
    """Full jitter: a whole number of seconds uniform in [1, ceiling] (queue delays are whole seconds)."""
    ceiling = backoff_ceiling(attempt, base_s, cap_s)
    return max(1, round(rand() * ceiling))


def poll_delay(polls: int, initial_s: int, cap_s: int) -> int:
    """A growing delay for status checks of offloaded work: initial * 2^polls, capped."""
    return int(min(cap_s, initial_s * (2 ** min(polls, 30))))


@dataclass(frozen=True)
class RetryPolicy:
    """How a kind's transient failures are retried: at most `attempts` runs in all, the delay
    before run n+1 drawn up to base * 2^(n-1) capped at `cap_s` (full jitter; without jitter,
    the ceiling itself). A cause's Retry-After is honoured up to the cap."""

    attempts: int
    base_s: float
    cap_s: float
    jitter: bool = True

    def problems(self, prefix: str = "") -> list[str]:
        """What is wrong with the policy, naming the settings under `prefix` (pure)."""
        found = []
        if self.attempts < 1:
            found.append(f"{prefix}MAX_ATTEMPTS={self.attempts} must be >= 1")
        if self.base_s < 0:
            found.append(f"{prefix}RETRY_BASE_SECONDS={self.base_s:g} must be >= 0")
        if self.cap_s < self.base_s:
            found.append(
                f"{prefix}RETRY_MAX_SECONDS={self.cap_s:g} must be >= {prefix}RETRY_BASE_SECONDS={self.base_s:g}"
            )
        return found

    def delay(
        self, attempt: int, retry_after_s: float | None = None, rand: Callable[[], float] = random.random
    ) -> int:
        """Whole seconds before run `attempt` (>= 1 failures so far) (pure but for `rand`)."""
        if self.jitter:
            wait = retry_delay(attempt, self.base_s, self.cap_s, rand)
        else:
            wait = max(1, round(backoff_ceiling(attempt, self.base_s, self.cap_s)))
        if retry_after_s is not None and retry_after_s > 0:
            wait = max(wait, math.ceil(min(self.cap_s, retry_after_s)))
        return wait
