"""Run the local Functions host (devhost) as a child process, as `func start` would run the app."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from devhost.config import load_settings_values

if TYPE_CHECKING:
    from devstack.faultproxy import FaultProxy

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_RE = re.compile(r"devhost ready http=(\S+)")


@dataclass
class HostProcess:
    """One devhost process; `url` is its HTTP base (http://127.0.0.1:PORT)."""

    env: dict[str, str]
    port: int = 0
    instance_id: str = "host-1"
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen[str] | None = None
    url: str = ""
    _log: IO[str] | None = None

    def start(self, timeout_s: float = 60.0) -> HostProcess:
        args = [
            sys.executable,
            "-m",
            "devhost",
            "--app-dir",
            str(REPO_ROOT),
            "--port",
            str(self.port),
            "--instance-id",
            self.instance_id,
            "--count-requests",
            *self.extra_args,
        ]
        self._log = open(self.log_path, "a", encoding="utf-8") if self.log_path else None  # noqa: SIM115
        self.process = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=self._log or subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"devhost {self.instance_id} exited with {self.process.returncode}; see its log"
                    )
                continue
            match = READY_RE.search(line)
            if match:
                self.url = match.group(1)
                threading.Thread(target=self._drain_stdout, daemon=True).start()
                return self
        self.kill()
        raise TimeoutError(f"devhost {self.instance_id} not ready after {timeout_s:.0f}s")

    def _drain_stdout(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            if self._log:
                self._log.write(line)

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/_devhost/stats", timeout=10) as resp:
            return dict(json.loads(resp.read()))

    def stop(self, timeout_s: float = 40.0) -> None:
        """SIGTERM, wait for in-flight invocations, then SIGKILL if needed."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._close()

    def kill(self) -> None:
        """kill -9: no cleanup, as a crashed instance."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        self._close()

    def _close(self) -> None:
        self.process = None
        if self._log:
            self._log.close()
            self._log = None


SAMPLE_SETTINGS = REPO_ROOT / "local.settings.sample.json"
LOCAL_SETTINGS = REPO_ROOT / "local.settings.json"


def layer_settings(
    sample: Mapping[str, str],
    local: Mapping[str, str],
    environ: Mapping[str, str],
    overrides: Mapping[str, str],
) -> dict[str, str]:
    """A host's environment, each layer over the ones before it: the sample's Values, then
    local.settings.json's Values, then the exported environment (variables already set win over
    the settings file, as with `func start`), then the caller's explicit overrides."""
    return {**sample, **local, **environ, **overrides}


def host_env(
    connection_string: str,
    settings: Mapping[str, str] | None = None,
    storage_proxy: FaultProxy | None = None,
    local_settings: Path | None = LOCAL_SETTINGS,
) -> dict[str, str]:
    """Environment for a devhost (`layer_settings`): the repo's settings sample, `local_settings`
    when that file exists (None: not read), the environment, then `AzureWebJobsStorage` and
    `settings`.

    With `storage_proxy`, the host's blob and queue requests go through it (devstack/faultproxy.py).
    """
    if storage_proxy is not None:
        connection_string = storage_proxy.route(connection_string)
    sample = load_settings_values(SAMPLE_SETTINGS)
    local = load_settings_values(local_settings) if local_settings and local_settings.is_file() else {}
    overrides = {"AzureWebJobsStorage": connection_string, "PYTHONUNBUFFERED": "1", **(settings or {})}
    return layer_settings(sample, local, os.environ, overrides)


def init_storage(env: Mapping[str, str]) -> None:
    """`python -m shared.interfaces.cli init` on `env` (`host_env`'s): the queues, containers and
    tables a host on those settings uses, made before it starts. Its output is kept (shown when it fails)."""
    subprocess.run(
        [sys.executable, "-m", "shared.interfaces.cli", "init"],
        env=dict(env),
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )


def count_decisions(*logs: Path) -> Counter[str]:
    """Count the app's structured decision records (`{"decision": ...}` lines) in host logs."""
    found: Counter[str] = Counter()
    for log in logs:
        if not log.exists():
            continue
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            start = line.find('{"decision"')
            if start >= 0:
                with contextlib.suppress(ValueError, KeyError):
                    found[json.loads(line[start:])["decision"]] += 1
    return found
