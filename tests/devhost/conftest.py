"""Fixtures for devhost integration tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from devhost_support import Scenario

from devstack.azurite import Azurite


@pytest.fixture
def scenario(azurite: Azurite, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Scenario]:
    short = request.node.name.removeprefix("test_").replace("_", "")[:20].lower()
    jobs = f"dh-{short}-{uuid.uuid4().hex[:8]}"
    settings = {
        "AzureWebJobsStorage": azurite.connection_string,
        "JOBS_QUEUE": jobs,
        "POISON_WATCH_QUEUE": f"{jobs}-unwatched",
        "TICK_SCHEDULE": "0 0 0 1 1 *",
        "DEVHOST_TEST_RECORD": str(tmp_path / "records.jsonl"),
    }
    sc = Scenario(azurite, tmp_path, short, tmp_path / "records.jsonl", settings)
    try:
        yield sc
    finally:
        for dp in sc.procs:
            if dp.proc.poll() is None:
                dp.proc.kill()
                dp.proc.wait(10)
