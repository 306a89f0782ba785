"""The console overview's counters (kept by the core, read by the console): counted in memory per
process, flushed on a timer to one document per instance per hour, so they add no storage request
per message.

One document per instance per hour, holding per-minute counts (completed, retried, poisoned), a
latency histogram per minute (enqueue to completion, `LATENCY_BOUNDS_S`) and the instance's jobs in
flight, kept by a `CounterStore`: a Table entity per (hour, instance) (shared/indexes/counters.py:
a refresh is one query, no listing). The blobs `console/metrics/<YYYY-MM-DDTHH>/<instance>.json` of
the poison-archive container are what the app wrote before the table (`blob_name`, `prune`). Each
process also deletes hours older than `RETENTION_H`, once an hour, so the documents do not pile up
as instances come and go.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any, ParamSpec, Protocol, TypeVar

from shared.core.documents import DocumentStore
from shared.core.envelope import isoformat, utcnow
from shared.observability.decisions import add_listener

log = logging.getLogger("jobs.console.metrics")

PREFIX = "console/metrics/"
FLUSH_S = 60.0
"""How often a process writes its counters (one upsert, only when something changed)."""
WINDOW_MIN = 60
"""The overview shows the last hour, minute by minute."""
RETENTION_H = 48
"""Hours of counters kept in storage; older hours' documents are deleted (`CounterStore.prune`)."""
LATENCY_BOUNDS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
"""Upper bounds of the latency bins; one more bin holds everything slower."""
COUNTED = {"completed": "completed", "retry_scheduled": "retried", "poisoned": "poisoned"}
SERIES = ("completed", "retried", "poisoned")
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def minute_key(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M")


def hour_key(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H")


def instance_key(instance: str) -> str:
    """An instance's name as it appears in a blob name or a table key."""
    return _SAFE.sub("_", instance)


def blob_name(hour: str, instance: str) -> str:
    return f"{PREFIX}{hour}/{instance_key(instance)}.json"


class CounterStore(Protocol):
    """Where instances' hour documents are kept."""

    def write(self, hour: str, instance: str, doc: Mapping[str, Any]) -> None:
        """Upsert one instance's document of one hour (one request)."""

    def read(self, hours: list[str], skip_instance: str | None) -> list[Mapping[str, Any]]:
        """Every instance's documents of `hours` except `skip_instance`'s."""

    def prune(self, now: datetime) -> int:
        """Delete documents older than `RETENTION_H`; how many."""


def bin_index(latency_s: float) -> int:
    """The histogram bin of one latency."""
    for index, bound in enumerate(LATENCY_BOUNDS_S):
        if latency_s <= bound:
            return index
    return len(LATENCY_BOUNDS_S)


def percentile(hist: list[int], q: float) -> float | None:
    """The upper bound of the bin holding quantile `q` (None: no samples; inf: the overflow bin)."""
    total = sum(hist)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(hist):
        seen += count
        if seen >= rank and count:
            return LATENCY_BOUNDS_S[index] if index < len(LATENCY_BOUNDS_S) else float("inf")
    return float("inf")


def _new_minute() -> dict[str, Any]:
    return {"completed": 0, "retried": 0, "poisoned": 0, "latency": [0] * (len(LATENCY_BOUNDS_S) + 1)}


class Recorder:
    """This process's counters. Thread-safe; `on_decision` is an observability listener."""

    def __init__(self, clock: Callable[[], datetime] = utcnow) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.minutes: dict[str, dict[str, Any]] = {}
        self.in_flight = 0
        self._dirty: set[str] = set()
        self.flushes = 0

    def on_decision(self, decision: str, fields: Mapping[str, Any]) -> None:
        name = COUNTED.get(decision)
        if name is None:
            return
        now = self.clock()
        with self._lock:
            minute = self.minutes.setdefault(minute_key(now), _new_minute())
            minute[name] += 1
            latency = fields.get("latency_s")
            if name == "completed" and isinstance(latency, int | float) and latency >= 0:
                minute["latency"][bin_index(float(latency))] += 1
            self._dirty.add(hour_key(now))
            oldest = minute_key(now - timedelta(hours=2))
            for key in [k for k in self.minutes if k < oldest]:
                del self.minutes[key]

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Counts one job delivery in flight while the block runs."""
        with self._lock:
            self.in_flight += 1
            self._dirty.add(hour_key(self.clock()))
        try:
            yield
        finally:
            with self._lock:
                self.in_flight -= 1
                self._dirty.add(hour_key(self.clock()))

    def document(self, hour: str, instance: str) -> dict[str, Any]:
        """What this process writes (and what a refresh served by it uses, unflushed)."""
        with self._lock:
            minutes = {
                k: {**v, "latency": list(v["latency"])} for k, v in self.minutes.items() if k.startswith(hour)
            }
            return {
                "instance": instance,
                "hour": hour,
                "written_at": isoformat(self.clock()),
                "in_flight": self.in_flight,
                "minutes": minutes,
            }

    def flush(self, store: CounterStore, instance: str) -> int:
        """Write the hours that changed since the last flush: one upsert each. Returns how many."""
        with self._lock:
            hours, self._dirty = sorted(self._dirty), set()
        for hour in hours:
            try:
                store.write(hour, instance, self.document(hour, instance))
            except Exception:
                with self._lock:
                    self._dirty.add(hour)
                raise
        self.flushes += len(hours)
        return len(hours)


RECORDER = Recorder()
P = ParamSpec("P")
R = TypeVar("R")


def counted_in_flight(fn: Callable[P, R]) -> Callable[P, R]:
    """Count calls of `fn` in flight in this process's recorder (the overview's "in flight")."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with RECORDER.running():
            return fn(*args, **kwargs)

    return wrapper


_install_lock = threading.Lock()
_installed: dict[str, Any] = {}


def install(store: CounterStore, instance: str, period_s: float = FLUSH_S) -> None:
    """Count this process's decisions and flush them every `period_s` (once per process)."""
    with _install_lock:
        if _installed:
            return
        _installed.update(store=store, instance=instance)
        add_listener(RECORDER.on_decision)

        def loop() -> None:
            stop = threading.Event()
            pruned_hour = ""
            while not stop.wait(period_s):
                try:
                    RECORDER.flush(store, instance)
                    hour = hour_key(RECORDER.clock())
                    if hour != pruned_hour:
                        store.prune(RECORDER.clock())
                        pruned_hour = hour
                except Exception as exc:  # the next period tries again
                    log.warning("console metrics: flush failed (%s); retrying next period", exc)

        threading.Thread(target=loop, name="console-metrics", daemon=True).start()


def installed_instance() -> str | None:
    """This process's instance name when counting is installed (its blob is read live, not from storage)."""
    value = _installed.get("instance")
    return str(value) if value else None


def expired(names: Iterable[str], now: datetime, retention_h: int = RETENTION_H) -> list[str]:
    """The counter blobs among `names` whose hour is older than `retention_h` (pure)."""
    oldest = hour_key(now - timedelta(hours=retention_h))
    found = []
    for name in names:
        hour = name[len(PREFIX) :].split("/", 1)[0] if name.startswith(PREFIX) else ""
        if hour and hour < oldest:
            found.append(name)
    return found


def prune(store: DocumentStore, now: datetime, retention_h: int = RETENTION_H) -> int:
    """Delete counter blobs older than `retention_h` hours; how many. Several processes may prune
    at once: a blob already deleted is no error."""
    names = expired((name for name, _ in store.names(PREFIX)), now, retention_h)
    for name in names:
        store.delete(name)
    return len(names)


# -- reading (pure) ---------------------------------------------------------------------------


def _count(value: Any) -> int:
    """A count from a document: a non-negative whole number, else 0 (a damaged document adds nothing)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def merge(docs: list[Mapping[str, Any]], now: datetime, stale_after_s: float = 3 * FLUSH_S) -> dict[str, Any]:
    """The overview's figures from instance documents: per-minute series over the last hour,
    latency p50/p95 over the hour, and jobs in flight (instances heard from recently). A field of
    the wrong type (another version's, or a damaged document) counts nothing; it never fails."""
    keys = [minute_key(now - timedelta(minutes=WINDOW_MIN - 1 - i)) for i in range(WINDOW_MIN)]
    series = {name: [0] * WINDOW_MIN for name in SERIES}
    hist = [0] * (len(LATENCY_BOUNDS_S) + 1)
    index = {key: i for i, key in enumerate(keys)}
    latest: dict[str, tuple[datetime, int]] = {}
    for doc in docs:
        minutes = doc.get("minutes")
        for key, minute in minutes.items() if isinstance(minutes, Mapping) else ():
            slot = index.get(key)
            if slot is None or not isinstance(minute, Mapping):
                continue
            for name in SERIES:
                series[name][slot] += _count(minute.get(name))
            latency = minute.get("latency")
            for i, count in enumerate(latency[: len(hist)] if isinstance(latency, list) else ()):
                hist[i] += _count(count)
        try:
            written = datetime.fromisoformat(str(doc.get("written_at", "")).replace("Z", "+00:00"))
            age_s = (now - written).total_seconds()
        except (ValueError, TypeError):  # unreadable, or without a zone
            continue
        instance = str(doc.get("instance", ""))
        if age_s <= stale_after_s and (instance not in latest or latest[instance][0] < written):
            latest[instance] = (written, _count(doc.get("in_flight")))
    in_flight = sum(count for _, count in latest.values())
    return {
        "minutes": keys,
        "series": series,
        "latency_hist": hist,
        "latency_p50_s": percentile(hist, 0.5),
        "latency_p95_s": percentile(hist, 0.95),
        "in_flight": in_flight,
    }


def hours_to_read(now: datetime) -> list[str]:
    """The hour prefixes covering the last `WINDOW_MIN` minutes."""
    return sorted({hour_key(now - timedelta(minutes=WINDOW_MIN - 1)), hour_key(now)})
