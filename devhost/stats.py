"""Thread-safe counters served at GET /_devhost/stats."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from devhost.storage import RequestCounter

QUEUE_COUNTERS = (
    "received",
    "invocations",
    "successes",
    "failures",
    "timeouts",
    "poison_moves",
    "releases",
    "left_leased",
    "undecodable",
    "deletes",
    "deletes_ignored",
    "releases_ignored",
    "renewals",
    "renewal_errors",
    "renewals_lost",
    "output_messages",
    "polls",
    "empty_polls",
    "poll_errors",
    "wakes",
    "storage_errors",
)


class Counters:
    def __init__(self, lock: threading.Lock, static: dict[str, Any], names: tuple[str, ...]) -> None:
        self._lock = lock
        self.static = static
        self.values: dict[str, int] = dict.fromkeys(names, 0)
        self.gauges: dict[str, Callable[[], float]] = {}

    def incr(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.values[name] = self.values.get(name, 0) + n

    def get(self, name: str) -> int:
        with self._lock:
            return self.values.get(name, 0)


class Stats:
    def __init__(self, instance_id: str, requests: RequestCounter | None = None) -> None:
        self.instance_id = instance_id
        self.requests = requests
        self.started = time.time()
        self._lock = threading.Lock()
        self._sections: dict[str, dict[str, Counters]] = {"queues": {}, "http": {}, "timers": {}}
        self._providers: dict[str, Callable[[], Any]] = {}

    def provide(self, key: str, fn: Callable[[], Any]) -> None:
        """Serve `fn()` as `key` in every snapshot (e.g. the worker process's state)."""
        with self._lock:
            self._providers[key] = fn

    def section(self, kind: str, key: str, names: tuple[str, ...] = (), **static: Any) -> Counters:
        counters = Counters(self._lock, static, names)
        with self._lock:
            existing = self._sections[kind]
            unique, n = key, 2
            while unique in existing:
                unique, n = f"{key}#{n}", n + 1
            existing[unique] = counters
        return counters

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {
                "instance_id": self.instance_id,
                "uptime_s": round(time.time() - self.started, 3),
            }
            for kind, entries in self._sections.items():
                out[kind] = {key: {**c.static, **c.values} for key, c in entries.items()}
            providers = dict(self._providers)
            gauges = {
                (kind, key): c.gauges
                for kind, entries in self._sections.items()
                for key, c in entries.items()
            }
        for (kind, key), funcs in gauges.items():
            for name, fn in funcs.items():
                out[kind][key][name] = fn()
        for key, provider in providers.items():
            out[key] = provider()
        if self.requests is not None:
            out["storage_requests"] = self.requests.snapshot()
        return out
