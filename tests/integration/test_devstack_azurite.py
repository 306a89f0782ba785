"""The devstack's Azurite launcher: distinct ports, a failed start seen at once, the V8 flags."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devstack.azurite import NODE_FLAGS, Azurite, StartFailed
from devstack.ports import free_ports

pytestmark = pytest.mark.integration


def test_free_ports_are_distinct() -> None:
    for _ in range(50):
        ports = free_ports(3)
        assert len(set(ports)) == 3


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
