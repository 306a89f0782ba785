"""The local stack's settings (`make up`, devstack/hostproc.py): the sample, then local.settings.json,
then exported variables, then the caller's explicit overrides, as `func start` layers them."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from devstack.azurite import Azurite
from devstack.hostproc import SAMPLE_SETTINGS, HostProcess, host_env, layer_settings
from tests.integration.helpers import unique


def test_each_layer_wins_over_the_ones_before_it() -> None:
    sample = {"A": "sample", "B": "sample", "C": "sample", "D": "sample", "E": "sample"}
    local = {"B": "local", "C": "local", "D": "local", "F": "local"}
    environ = {"C": "env", "D": "env", "PATH": "/bin"}
    overrides = {"D": "explicit", "G": "explicit"}
    assert layer_settings(sample, local, environ, overrides) == {
        "A": "sample",
        "B": "local",
        "C": "env",
        "D": "explicit",
        "E": "sample",
        "F": "local",
        "G": "explicit",
        "PATH": "/bin",
    }
    assert sample["B"] == "sample" and "G" not in local  # the layers are not changed


def write_local(path: Path, values: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"IsEncrypted": False, "Values": values}), encoding="utf-8")
    return path


def test_host_env_reads_local_settings_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = write_local(
        tmp_path / "local.settings.json",
        {"MAX_ATTEMPTS": 3, "RETENTION_BY_APP": False, "RETRY_MAX_SECONDS": "60", "EXTRA": "x"},
    )
    monkeypatch.setenv("RETRY_MAX_SECONDS", "77")
    monkeypatch.setenv("JOBS_QUEUE", "exported")
    env = host_env("UseDevelopmentStorage=true", {"JOBS_QUEUE": "explicit"}, local_settings=local)
    sample = json.loads(SAMPLE_SETTINGS.read_text(encoding="utf-8"))["Values"]
    assert sample["MAX_ATTEMPTS"] == "5" and sample["RETRY_MAX_SECONDS"] == "300"  # what is overridden
    assert env["MAX_ATTEMPTS"] == "3" and env["RETENTION_BY_APP"] == "false" and env["EXTRA"] == "x"
    assert env["RETRY_MAX_SECONDS"] == "77"  # exported: over local.settings.json
    assert env["JOBS_QUEUE"] == "explicit"  # the caller's: over everything
    assert env["AzureWebJobsStorage"] == "UseDevelopmentStorage=true"
    assert env["RETRY_BASE_SECONDS"] == sample["RETRY_BASE_SECONDS"]  # set nowhere else: the sample's
    unread = host_env("UseDevelopmentStorage=true", local_settings=None)
    assert unread["MAX_ATTEMPTS"] == "5" and "EXTRA" not in unread
    missing = host_env("UseDevelopmentStorage=true", local_settings=tmp_path / "absent.json")
    assert missing["MAX_ATTEMPTS"] == "5"


def process_environ(pid: int) -> dict[str, str]:
    path = Path(f"/proc/{pid}/environ")
    if not path.exists():
        pytest.skip("no /proc here to read a process's environment")
    entries = path.read_bytes().decode("utf-8", "replace").split("\0")
    return dict(entry.split("=", 1) for entry in entries if "=" in entry)


def test_an_edited_local_setting_and_an_exported_variable_reach_the_started_host(
    azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `make up` starts the host: a value edited in local.settings.json, and a variable exported
    over another, are what the host and the app see (the sample says otherwise for both)."""
    exported_queue = unique("exported")
    local = write_local(
        tmp_path / "local.settings.json",
        {"JOBS_QUEUE": unique("fromlocal"), "MAX_ATTEMPTS": "3", "LEDGER_CONTAINER": unique("ledger")},
    )
    monkeypatch.setenv("JOBS_QUEUE", exported_queue)
    monkeypatch.setenv("LEDGER_CONTAINER", "not-this-one")
    explicit_ledger = unique("ledger")
    env = host_env(azurite.connection_string, {"LEDGER_CONTAINER": explicit_ledger}, local_settings=local)
    host = HostProcess(env, log_path=tmp_path / "host.log").start()
    try:
        assert host.process is not None
        seen = process_environ(host.process.pid)
        assert seen["MAX_ATTEMPTS"] == "3"  # local.settings.json over the sample's 5
        assert seen["JOBS_QUEUE"] == exported_queue and seen["LEDGER_CONTAINER"] == explicit_ledger
        with urllib.request.urlopen(f"{host.url}/api/health", timeout=60) as resp:
            health = json.loads(resp.read())
        assert health["status"] == "ok" and health["queue"] == exported_queue  # the app's setting
        assert exported_queue in host.stats()["queues"]  # the host's queue trigger (%JOBS_QUEUE%)
    finally:
        host.stop()
