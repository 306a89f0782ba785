"""Helpers for devhost integration tests: start `python -m devhost` as a real subprocess."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueClient

from devstack.azurite import Azurite

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_APP = Path(__file__).resolve().parent / "sample_app"
T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def settled_counts(
    host: DevhostProcess, queue: str, key: str, value: int, timeout: float = 5.0
) -> dict[str, Any]:
    """The host's counts for `queue` once counts[key] == value. The host counts a completion
    (delete, poison move) when Azurite's answer reaches it: the queue can show it a moment before."""
    seen: dict[str, Any] = {}

    def check() -> bool:
        nonlocal seen
        seen = host.stats()["queues"][queue]
        return bool(seen.get(key) == value)

    try:
        wait_for(check, timeout, f"{key} == {value} on {queue}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last counts: {seen}") from None
    return seen


@dataclass
class DevhostProcess:
    proc: subprocess.Popen[str]
    url: str
    functions: list[str]
    log_path: Path

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def stats(self) -> dict[str, Any]:
        status, body = self.get("/_devhost/stats")
        assert status == 200
        return dict(json.loads(body))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 40) -> int:
        """SIGTERM by PID and wait."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise


@dataclass
class Scenario:
    """One test's world: unique queue names, a record file, and devhost processes."""

    azurite: Azurite
    tmp_path: Path
    name: str
    record_path: Path
    settings: dict[str, str]
    procs: list[DevhostProcess] = field(default_factory=list)

    @property
    def jobs_queue(self) -> str:
        return self.settings["JOBS_QUEUE"]

    def queue(self, name: str) -> QueueClient:
        return QueueClient.from_connection_string(self.azurite.connection_string, name)

    def copy_app(self, **queue_options: Any) -> Path:
        """A copy of the sample app with host.json changed (extensions.queues keys, or functionTimeout)."""
        target = self.tmp_path / "app"
        shutil.copytree(SAMPLE_APP, target, ignore=shutil.ignore_patterns("__pycache__"))
        host = json.loads((target / "host.json").read_text())
        if "functionTimeout" in queue_options:
            host["functionTimeout"] = queue_options.pop("functionTimeout")
        host["extensions"]["queues"].update(queue_options)
        (target / "host.json").write_text(json.dumps(host))
        return target

    def env(self, **overrides: str) -> dict[str, str]:
        return {**os.environ, **self.settings, "PYTHONPATH": str(REPO_ROOT), **overrides}

    def start(
        self,
        *extra: str,
        env: dict[str, str] | None = None,
        instance: str | None = None,
        app_dir: Path = SAMPLE_APP,
    ) -> DevhostProcess:
        full_env = self.env(**(env or {}))
        instance = instance or f"{self.name}-{len(self.procs)}"
        log_path = self.tmp_path / f"{instance}.log"
        args = [sys.executable, "-m", "devhost", "--app-dir", str(app_dir), "--port", "0"]
        args += ["--instance-id", instance, *extra]
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(
                args, cwd=REPO_ROOT, env=full_env, stdout=subprocess.PIPE, stderr=log_file, text=True
            )
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            for text in proc.stdout or []:
                lines.put(text)
            lines.put("")  # EOF: the process ended

        threading.Thread(target=pump, daemon=True).start()
        try:
            line = lines.get(timeout=30)
        except queue.Empty:
            line = ""
        if not line.startswith("devhost ready http="):
            proc.kill()
            proc.wait(10)
            raise AssertionError(f"devhost did not become ready ({line!r}):\n{log_path.read_text()}")
        url = line.split("http=")[1].split()[0]
        functions = line.strip().split("functions=")[1].split(",")
        dp = DevhostProcess(proc, url, functions, log_path)
        self.procs.append(dp)
        return dp

    def records(self, fn: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        if not self.record_path.exists():
            return []
        rows = [json.loads(x) for x in self.record_path.read_text().splitlines() if x.strip()]
        return [
            r for r in rows if (fn is None or r["fn"] == fn) and (event is None or r.get("event") == event)
        ]


def queue_exists(q: QueueClient) -> bool:
    try:
        q.get_queue_properties()
        return True
    except ResourceNotFoundError:
        return False


def queue_is_empty(q: QueueClient) -> bool:
    return q.get_queue_properties().approximate_message_count == 0
