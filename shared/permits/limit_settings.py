"""The limits' settings, read and checked at start-up (a bad one refuses to start, naming it).

- `PERMIT_LEASE_SECONDS` (15-60, default 30): how long a permit lasts without renewal, so how
  soon a killed or frozen holder's permit is taken back; renewed every third of it.
- `PERMITS_CONTAINER` (default `permits`): the Blob container of the permits' documents.
- `MAX_CONCURRENT`: at most this many jobs of a queue run at once across all instances (each
  queue's `QUEUE_<NAME>_MAX_CONCURRENT` in its place, shared/queues).
- `HTTP_MAX_CONCURRENT_PER_HOST`, `HTTP_MAX_PER_SECOND_PER_HOST`: the `http` kind's calls to one
  destination host; `HTTP_LIMITS_PER_HOST`: a JSON object of overrides by host,
  `{"api.partner.example": {"max_concurrent": 4, "per_second": 10}, "bulk.example": null}`
  (null: that host is not limited; a field left out takes the default).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.core.errors import SettingsError
from shared.core.setting_reader import SettingReader
from shared.permits.limit import Limit, LimitError, host_key, queue_key

HOST_RE = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
LIMIT_FIELDS = ("max_concurrent", "per_second")


@dataclass(frozen=True)
class PermitSettings:
    lease_s: float = 30.0
    container: str = "permits"
    queue_max: Mapping[str, int] = field(default_factory=dict)
    """Queue name -> MAX_CONCURRENT."""

    def queue_limit(self, queue: str) -> Limit | None:
        n = self.queue_max.get(queue)
        return Limit(queue_key(queue), n) if n else None


def read_permit_settings(
    source: Mapping[str, str], jobs_queue: str, queue_max: Mapping[str, int | None] | None = None
) -> PermitSettings:
    """The app's permit settings; SettingsError naming every bad one. `queue_max`: each declared
    queue's own `QUEUE_<NAME>_MAX_CONCURRENT` (read by shared/queues; None: the app's
    `MAX_CONCURRENT`); without it, the jobs queue alone."""
    problems: list[str] = []
    reader = SettingReader(source, problems)
    lease = reader.number("PERMIT_LEASE_SECONDS", 30.0, 15.0)
    if lease > 60:
        problems.append(
            f"PERMIT_LEASE_SECONDS={lease:g} must be <= 60 (a lost permit is back within one lease)"
        )
        lease = 30.0
    container = reader.resource_name("PERMITS_CONTAINER", "permits")
    app_max = reader.integer("MAX_CONCURRENT", 0, 1) or None
    if problems:
        raise SettingsError("invalid settings: " + "; ".join(problems))
    declared = queue_max if queue_max is not None else {jobs_queue: None}
    limits = {queue: own or app_max for queue, own in declared.items()}
    return PermitSettings(lease, container, {queue: n for queue, n in limits.items() if n})


@dataclass(frozen=True)
class HostLimits:
    """The `http` kind's limits by destination host."""

    max_concurrent: int | None = None
    per_second: float | None = None
    overrides: Mapping[str, tuple[int | None, float | None] | None] = field(default_factory=dict)

    def any(self) -> bool:
        """Whether some host is limited."""
        return (
            self.max_concurrent is not None
            or self.per_second is not None
            or any(v is not None for v in self.overrides.values())
        )

    def for_host(self, host: str) -> Limit | None:
        host = host.strip().lower().rstrip(".")
        if host in self.overrides:
            chosen = self.overrides[host]
            if chosen is None:
                return None
            max_concurrent, per_second = chosen
        else:
            max_concurrent, per_second = self.max_concurrent, self.per_second
        if max_concurrent is None and per_second is None:
            return None
        return Limit(host_key(host), max_concurrent, per_second)


def read_host_limits(reader: SettingReader, prefix: str = "HTTP_") -> HostLimits:
    """`<prefix>MAX_CONCURRENT_PER_HOST`, `<prefix>MAX_PER_SECOND_PER_HOST` and
    `<prefix>LIMITS_PER_HOST`; each problem is added to the reader naming its setting."""
    concurrent = reader.integer(f"{prefix}MAX_CONCURRENT_PER_HOST", 0, 1) or None
    rate = reader.number(f"{prefix}MAX_PER_SECOND_PER_HOST", 0.0, 0.0) or None
    name = f"{prefix}LIMITS_PER_HOST"
    raw = reader.text(name, "")
    overrides: dict[str, tuple[int | None, float | None] | None] = {}
    if raw:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            reader.problem(f"{name} is not JSON ({exc.msg} at character {exc.pos})")
            data = {}
        if not isinstance(data, dict):
            reader.problem(
                f'{name} must be a JSON object of host -> {{"max_concurrent": N, "per_second": R}} or null'
            )
            data = {}
        for host, value in data.items():
            parsed = _override(name, str(host), value, concurrent, rate, reader)
            if parsed is not False:
                overrides[str(host).lower().rstrip(".")] = parsed  # type: ignore[assignment]
    return HostLimits(concurrent, rate, overrides)


def _override(
    name: str, host: str, value: Any, concurrent: int | None, rate: float | None, reader: SettingReader
) -> tuple[int | None, float | None] | bool | None:
    where = f"{name}[{host[:80]!r}]"
    if not HOST_RE.match(host.lower().rstrip(".")):
        reader.problem(f"{where}: not a host name (no scheme, port or path)")
        return False
    if value is None:
        return None
    if not isinstance(value, dict) or not value or set(value) - set(LIMIT_FIELDS):
        reader.problem(f"{where} must be null or an object with max_concurrent and/or per_second")
        return False
    max_concurrent = value.get("max_concurrent", concurrent)
    per_second = value.get("per_second", rate)
    try:
        Limit(host_key(host), max_concurrent, per_second)
    except LimitError as exc:
        reader.problem(f"{where}: {exc}")
        return False
    return max_concurrent, per_second
