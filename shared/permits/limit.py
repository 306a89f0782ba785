"""A limit on the jobs of one key: how many run at once, how many start a second (pure)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

KEY_RE = re.compile(r"^[a-z0-9][a-z0-9._:\-]{0,199}$")
"""A key: lower-case letters, digits and `. _ : -`, 1-200 characters (`http:api.example.com`)."""


class LimitError(ValueError):
    """A limit that cannot be enforced (a bad key or value); the message names it."""


@dataclass(frozen=True)
class Limit:
    """At most `max_concurrent` jobs of `key` run at once across all instances, and at most
    `per_second` of them start in any second; either may be None (not limited), not both."""

    key: str
    max_concurrent: int | None = None
    per_second: float | None = None

    def __post_init__(self) -> None:
        if not KEY_RE.match(self.key):
            raise LimitError(f"limit key {self.key[:80]!r}: use 1-200 of a-z 0-9 . _ : - (lower case)")
        if self.max_concurrent is None and self.per_second is None:
            raise LimitError(f"limit {self.key}: give max_concurrent, per_second or both")
        if self.max_concurrent is not None and (
            isinstance(self.max_concurrent, bool)
            or not isinstance(self.max_concurrent, int)
            or self.max_concurrent < 1
        ):
            raise LimitError(f"limit {self.key}: max_concurrent must be an integer >= 1")
        if self.per_second is not None and not (
            isinstance(self.per_second, int | float)
            and math.isfinite(self.per_second)
            and self.per_second > 0
        ):
            raise LimitError(f"limit {self.key}: per_second must be a number > 0")

    @property
    def holds(self) -> bool:
        """True when a job holds a permit while it runs (a concurrency limit); a rate alone only
        notes the start."""
        return self.max_concurrent is not None

    def rate_window(self) -> tuple[float, int]:
        """(seconds, starts): at most `starts` grants in any window of `seconds` (pure).
        1/s or more: a 1-s window of floor(per_second) starts; slower: one start per 1/per_second s."""
        assert self.per_second is not None
        if self.per_second >= 1:
            return 1.0, int(self.per_second)
        return 1.0 / self.per_second, 1

    def describe(self) -> str:
        parts = []
        if self.max_concurrent is not None:
            parts.append(f"{self.max_concurrent} at once")
        if self.per_second is not None:
            parts.append(f"{self.per_second:g}/s")
        return f"{self.key} ({', '.join(parts)})"


def host_key(host: str) -> str:
    """The `http` kind's key of a destination host (`http:<host>`)."""
    return f"http:{host.strip().lower().rstrip('.')}"


def queue_key(queue: str) -> str:
    """A queue's key (`queue:<name>`): its MAX_CONCURRENT."""
    return f"queue:{queue}"
