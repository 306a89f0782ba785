"""A hostile JSON line through the local Functions host: its job is poisoned with a reason, and
the worker process that ran it lives on to run the next job (issue 19, item 4)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from azure.storage.blob import BlobServiceClient

from devstack.azurite import Azurite
from devstack.hostproc import HostProcess
from tests.integration.helpers import unique
from tests.integration.test_e2e_host import call, start_host, wait_status

__all__ = ["start_host"]  # the fixture, shared with the other end-to-end tests

DEPTH = 100_000


def aggregate_job(job_id: str, container: str, blob: str) -> dict[str, Any]:
    payload = {
        "input": f"{container}/{blob}",
        "format": "jsonl",
        "group_by": ["k"],
        "metrics": [{"op": "count"}],
    }
    return {"id": job_id, "kind": "aggregate", "payload": payload}


def worker_pid(host: HostProcess) -> int:
    pid = host.stats()["worker"]["pid"]
    assert isinstance(pid, int)
    return pid


def test_a_100000_deep_line_poisons_its_job_and_the_worker_runs_the_next(
    azurite: Azurite, start_host: Callable[..., HostProcess]
) -> None:
    container = unique("data")
    blobs = BlobServiceClient.from_connection_string(azurite.connection_string).get_container_client(
        container
    )
    blobs.create_container()
    deep = b'{"k": "a", "x": ' + b"[" * DEPTH + b"]" * DEPTH + b"}\n"
    blobs.upload_blob("deep.jsonl", b'{"k": "a"}\n' + deep)
    blobs.upload_blob("good.jsonl", b'{"k": "a"}\n{"k": "b"}\n')
    host = start_host()
    before = worker_pid(host)

    assert call(host, "POST", "jobs", aggregate_job("deep-1", container, "deep.jsonl"))[0] == 202
    record = wait_status(host, "deep-1", {"poisoned"}, timeout_s=120)
    assert "line 2 is nested more than 64 arrays or objects deep" in json.dumps(record), record

    assert call(host, "POST", "jobs", aggregate_job("after-1", container, "good.jsonl"))[0] == 202
    wait_status(host, "after-1", {"completed"}, timeout_s=120)
    status, result = call(host, "GET", "jobs/after-1/result")
    assert status == 200 and [row["k"] for row in result["rows"]] == ["a", "b"], result
    stats = host.stats()["worker"]
    assert worker_pid(host) == before and stats["restarts"] == 0 and stats["crashes"] == 0, stats
