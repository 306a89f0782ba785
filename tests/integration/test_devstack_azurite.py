"""The devstack's Azurite launcher: distinct ports, a failed start seen at once, the V8 flags."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import devstack.azurite
from devstack.azurite import NODE_FLAGS, Azurite, StartFailed
from devstack.ports import free_ports

pytestmark = pytest.mark.integration


def test_a_start_on_a_taken_port_is_tried_again_on_others(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first choice of ports clashes (its table port is taken): the next one starts."""
    taken = (*free_ports(2), azurite.blob_port)
    choices = iter([taken])
    monkeypatch.setattr(devstack.azurite, "free_ports", lambda n: next(choices, None) or free_ports(n))
    started = devstack.azurite.start_azurite()
    try:
        assert started.table_port != azurite.blob_port
        assert started.process is not None and started.process.poll() is None
    finally:
        started.cleanup()


def test_a_start_that_keeps_failing_says_so_after_its_attempts(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def clashing(n: int) -> tuple[int, ...]:
        calls.append(n)
        return (*free_ports(2), azurite.blob_port)

    monkeypatch.setattr(devstack.azurite, "free_ports", clashing)
    with pytest.raises(StartFailed, match="exited"):
        devstack.azurite.start_azurite()
    assert len(calls) == devstack.azurite.START_ATTEMPTS


def test_a_port_taken_fails_the_start_at_once(azurite: Azurite, tmp_path: Path) -> None:
    """The table port is the running Azurite's blob port: the new one exits, and start says so
    in seconds instead of waiting out its timeout (start_azurite then tries other ports)."""
    blob, queue = free_ports(2)
    clash = Azurite(blob, queue, azurite.blob_port, location=tmp_path)
    started = time.monotonic()
    with pytest.raises(StartFailed, match="exited"):
        clash.start()
    assert time.monotonic() - started < 20
    assert clash.process is None


def test_azurite_runs_with_the_heap_flags(azurite: Azurite) -> None:
    assert azurite.process is not None
    with open(f"/proc/{azurite.process.pid}/cmdline", "rb") as fh:
        argv = fh.read().split(b"\0")
    for flag in NODE_FLAGS:
        assert flag.encode() in argv
