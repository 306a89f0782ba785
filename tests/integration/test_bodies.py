"""Every body a producer can put on the jobs queue, through the local host with the SHIPPED
host.json (`messageEncoding: none`): raw JSON runs like base64, anything else is archived with
its bytes, a malformed job with a well-formed id answers `poisoned`, ids of dots are refused."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.storage.queue import QueueClient

from devstack.azurite import Azurite
from devstack.hostproc import REPO_ROOT, HostProcess, host_env, init_storage
from tests.integration.helpers import host_call, unique

pytestmark = pytest.mark.integration


class Stack:
    def __init__(self, host: HostProcess, azurite: Azurite, values: dict[str, str]) -> None:
        self.host = host
        self.values = values
        self.queue = QueueClient.from_connection_string(azurite.connection_string, values["JOBS_QUEUE"])
        """A plain client: puts text as given, as `az storage message put` does by default."""

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return host_call(self.host, method, path, body)

    def archived_bodies(self) -> dict[bytes, dict[str, Any]]:
        status, body = self.call("GET", "console/data/poison")
        assert status == 200, body
        found = {}
        for entry in body["archived"]:
            status, doc = self.call("GET", f"console/data/entry?name={entry['name']}")
            if status == 200:
                found[base64.b64decode(doc["body_b64"])] = doc
        return found


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not true after {timeout_s:.0f}s: {what}")


@pytest.fixture(scope="module")
def stack(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    values = {
        "JOBS_QUEUE": unique("bod"),
        "LEDGER_CONTAINER": unique("ledger"),
        "RESULTS_CONTAINER": unique("res"),
        "PAYLOADS_CONTAINER": unique("pay"),
        "POISON_ARCHIVE_CONTAINER": unique("arch"),
    }
    env = host_env(azurite.connection_string, values)
    init_storage(env)
    log: Path = tmp_path_factory.mktemp("bodies") / "host.log"
    host = HostProcess(env, log_path=log).start()  # the repository's own host.json
    try:
        yield Stack(host, azurite, values)
    finally:
        host.stop()


def test_the_shipped_host_json_hands_bodies_over_as_sent() -> None:
    queues = json.loads((REPO_ROOT / "host.json").read_text())["extensions"]["queues"]
    assert queues["messageEncoding"] == "none"


def test_a_raw_json_job_completes_like_a_base64_one(stack: Stack) -> None:
    raw, b64 = unique("raw-"), unique("b64-")
    stack.queue.send_message(json.dumps({"id": raw, "kind": "noop", "payload": {"note": "raw"}}))
    envelope = json.dumps({"id": b64, "kind": "noop", "payload": {"note": "base64 era"}})
    stack.queue.send_message(base64.b64encode(envelope.encode()).decode())
    for job_id in (raw, b64):

        def completed(j: str = job_id) -> bool:
            return bool(stack.call("GET", f"jobs/{j}")[1].get("status") == "completed")

        wait_for(f"{job_id} completed", completed)
    assert stack.call("GET", f"jobs/{raw}/result") == (200, {"id": raw, "summary": {"note": "raw"}})


def test_garbage_bodies_are_listed_with_their_bytes(stack: Stack) -> None:
    text = f"not base64, not JSON {unique('')}".encode()
    binary = b"\xff\xfe\x00" + unique("").encode() + b"\x80"  # not UTF-8: sent as base64 text
    started = time.monotonic()
    stack.queue.send_message(text.decode())
    stack.queue.send_message(base64.b64encode(binary).decode())
    found = wait_for(
        "both listed",
        lambda: (lambda got: got if {text, binary} <= set(got) else None)(stack.archived_bodies()),
    )
    print(f"\ngarbage bodies listed {time.monotonic() - started:.1f} s after they were put")
    assert "(raw, or base64-decoded) is not JSON" in found[text]["reason"]
    assert "is not UTF-8 text" in found[binary]["reason"]
    assert found[text]["job_id"] is None and found[binary]["job_id"] is None
    depth = stack.queue.get_queue_properties().approximate_message_count
    assert depth == 0


def test_unknown_kind_with_a_well_formed_id_answers_poisoned_with_its_reason(stack: Stack) -> None:
    job_id = unique("unk-")
    stack.queue.send_message(json.dumps({"id": job_id, "kind": "nope", "payload": {}}))
    record = wait_for(
        "poisoned", lambda: (lambda r: r if r[0] == 200 else None)(stack.call("GET", f"jobs/{job_id}"))
    )[1]
    assert record["status"] == "poisoned" and "unknown kind 'nope'" in record["reason"]

    def listed() -> list[list[str]]:
        entries = stack.call("GET", "console/data/poison")[1]["archived"]
        return [e["name"].split("/")[:2] for e in entries if e["job_id"] == job_id]

    assert wait_for("archived under the job", listed) == [["jobs", job_id]]


@pytest.mark.parametrize("job_id", [".", ".."])
def test_ids_of_dots_are_refused(stack: Stack, job_id: str) -> None:
    status, body = stack.call("POST", "jobs", {"id": job_id, "kind": "noop", "payload": {}})
    assert status == 400 and any("not only dots" in p for p in body["problems"]), body
    assert stack.call("GET", f"jobs/{job_id.replace('.', '%2E')}")[0] in (400, 404)
