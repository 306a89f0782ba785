"""Timer triggers: NCRONTAB (6 fields, with seconds) or TimeSpan schedules, evaluated in UTC."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from devhost.config import ConfigError, parse_timespan, resolve_setting_refs
from devhost.ipc import error_text, failure_details
from devhost.loader import FunctionSpec
from devhost.stats import Stats
from devhost.supervisor import Worker

log = logging.getLogger("devhost.timer")

# (name, low, high) for: second minute hour day month day-of-week (0 = Sunday; 7 also Sunday)
_FIELDS = (
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day", 1, 31),
    ("month", 1, 12),
    ("dow", 0, 7),
)


def parse_field(text: str, low: int, high: int) -> frozenset[int]:
    """One cron field: `*`, `*/n`, `a`, `a-b`, `a-b/n`, `a/n` and comma lists of those."""
    values: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if base == "*":
                lo, hi = low, high
            elif "-" in base:
                lo_text, hi_text = base.split("-", 1)
                lo, hi = int(lo_text), int(hi_text)
            else:
                lo = int(base)
                hi = high if step_text else lo
        except ValueError as exc:
            raise ConfigError(f"invalid cron field {text!r}") from exc
        if step < 1 or lo < low or hi > high or lo > hi:
            raise ConfigError(f"cron field {text!r} out of range [{low}, {high}]")
        values.update(range(lo, hi + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class CronSchedule:
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]

    def next_after(self, after: datetime) -> datetime:
        """The first matching time strictly after `after` (whole seconds; day AND weekday must match)."""
        t = after.replace(microsecond=0) + timedelta(seconds=1)
        limit = after + timedelta(days=366 * 5)
        while t < limit:
            if t.month not in self.months:
                t = (t.replace(day=1) + timedelta(days=32)).replace(day=1, hour=0, minute=0, second=0)
            elif t.day not in self.days or (t.weekday() + 1) % 7 not in self.weekdays:
                t = t.replace(hour=0, minute=0, second=0) + timedelta(days=1)
            elif t.hour not in self.hours:
                t = t.replace(minute=0, second=0) + timedelta(hours=1)
            elif t.minute not in self.minutes:
                t = t.replace(second=0) + timedelta(minutes=1)
            elif t.second not in self.seconds:
                t += timedelta(seconds=1)
            else:
                return t
        raise ConfigError("cron schedule never fires")


def parse_cron(expression: str) -> CronSchedule:
    fields = expression.split()
    if len(fields) != 6:
        raise ConfigError(
            f"NCRONTAB schedule needs 6 fields (second minute hour day month weekday): {expression!r}"
        )
    sets = [parse_field(text, low, high) for text, (_, low, high) in zip(fields, _FIELDS, strict=True)]
    weekdays = frozenset(0 if d == 7 else d for d in sets[5])
    return CronSchedule(sets[0], sets[1], sets[2], sets[3], sets[4], weekdays)


@dataclass(frozen=True)
class IntervalSchedule:
    """A TimeSpan schedule ("00:05:00"): every interval."""

    interval: float

    def next_after(self, after: datetime) -> datetime:
        return after + timedelta(seconds=self.interval)


Schedule = CronSchedule | IntervalSchedule


def parse_schedule(text: str) -> Schedule:
    if ":" in text and " " not in text.strip():
        seconds = parse_timespan(text)
        if seconds <= 0:
            raise ConfigError(f"timer interval must be positive: {text!r}")
        return IntervalSchedule(seconds)
    return parse_cron(text)


PAST_DUE_TOLERANCE = 1.0  # seconds late before an invocation counts as past due


class TimerRunner:
    """One thread per timer function; invocations of one timer never overlap."""

    def __init__(
        self,
        spec: FunctionSpec,
        environ: dict[str, str],
        stats: Stats,
        worker: Worker,
        send_outputs: Callable[[dict[str, list[bytes]]], int] | None = None,
    ) -> None:
        self.spec = spec
        self.send_outputs = send_outputs
        text = resolve_setting_refs(str(spec.trigger.get("schedule", "")), environ, f"function {spec.name}")
        self.schedule = parse_schedule(text)
        self.run_on_startup = bool(spec.trigger.get("runOnStartup", False))
        self.worker = worker
        self.counters = stats.section("timers", spec.name, ("runs", "failures", "past_due"), schedule=text)
        self._stop = threading.Event()
        self._busy = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"timer-{spec.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def wait_idle(self, deadline: float) -> bool:
        if self._busy.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._busy.release()
            return True
        return False

    def _run(self) -> None:
        last: datetime | None = None
        if self.run_on_startup:
            last = datetime.now(UTC)
            self._invoke(False, last, self.schedule.next_after(last))
        nxt = self.schedule.next_after(datetime.now(UTC))
        while not self._stop.is_set():
            remaining = (nxt - datetime.now(UTC)).total_seconds()
            if remaining > 0:
                self._stop.wait(remaining)
                continue
            late = -remaining
            following = self.schedule.next_after(max(nxt, datetime.now(UTC)))
            self._invoke(late > PAST_DUE_TOLERANCE, last, following)
            last = nxt
            nxt = self.schedule.next_after(max(nxt, datetime.now(UTC)))

    def _invoke(self, past_due: bool, last: datetime | None, following: datetime) -> None:
        with self._busy:
            if self._stop.is_set():
                return
            now = datetime.now(UTC)
            status = {
                "Last": last.isoformat() if last else None,
                "Next": following.isoformat(),
                "LastUpdated": now.isoformat(),
            }
            payload = (past_due, status, {"AdjustForDST": True})  # what TimerRequest is built from
            self.counters.incr("runs")
            if past_due:
                self.counters.incr("past_due")
            started = time.monotonic()
            try:
                outcome = self.worker.invoke(self.spec.name, str(uuid.uuid4()), payload)
                if self.send_outputs is not None:
                    self.send_outputs(outcome.queue_outputs)
            except Exception as exc:
                self.counters.incr("failures")
                log.error("Executed 'Functions.%s' (Failed): %s%s", self.spec.name, error_text(exc),
                          failure_details(exc))  # fmt: skip
                return
            log.info("Executed 'Functions.%s' (Succeeded, timer, past_due=%s, Duration=%.0fms)",
                     self.spec.name, past_due, (time.monotonic() - started) * 1000)  # fmt: skip
