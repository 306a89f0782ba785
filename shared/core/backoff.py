"""Pure retry-delay function: exponential backoff with full jitter."""

from __future__ import annotations

import random
from collections.abc import Callable


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
