"""Least privilege and bounded work per message, end to end against a real Azurite.

- A job naming an internal container (the app's ledger, results, payloads, poison archive; the
  host's azure-webjobs-secrets) is poisoned with the rule as its reason, and nothing stored in
  that container reaches the ledger record, the poison archive or a result. Each refused blob
  holds a secret placed where an input-data error would quote it if the blob were read.
- MAX_GROUPS: one group over it is poisoned naming the limit; with a Spark backend (a fake
  standalone master) and engine auto the job goes to Spark instead, recorded on the ledger.
- Capped reads: a claim-checked payload over MAX_PAYLOAD_BYTES, and results over the size
  MAX_GROUPS implies in GET /api/jobs/{id}/result.
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import azure.functions as func
import pytest
from azure.core.exceptions import ResourceExistsError

from devstack.azurite import Azurite
from shared import poison
from shared.interfaces import api
from shared.jobs import aggregate
from shared.pipeline.processing import process_message
from shared.runtime.wiring import Runtime
from shared.storage.limits import result_limit_bytes
from tests.integration.helpers import drain_raw, message, runtime_for, sdk
from tests.spark.fakes import FakeStandalone

pytestmark = pytest.mark.integration

HANDLERS = {"aggregate": aggregate.HANDLER}
HOST_RULE = "belongs to the Functions host (azure-webjobs-* and $-prefixed containers are never job input)"


@pytest.fixture
def rt(azurite: Azurite) -> Runtime:
    return runtime_for(azurite, HANDLERS)


def secret_blob(secret: str, fmt: str) -> bytes:
    """An input whose every value is `secret`: an error about its data would quote it."""
    if fmt == "csv":
        return f"k,v,{secret}-header\n{secret},{secret},{secret}\n".encode()
    return (json.dumps({"k": secret, "v": secret}) + "\n").encode()


def job(job_id: str, container: str, blob: str, fmt: str, **extra: Any) -> dict[str, Any]:
    payload = {
        "input": f"{container}/{blob}",
        "format": fmt,
        "group_by": ["k"],
        "metrics": [{"op": "count"}, {"op": "sum", "column": "v"}],
        **extra,
    }
    return {"id": job_id, "kind": "aggregate", "payload": payload}


def archive_poison_queue(rt: Runtime) -> int:
    """What the host does for handle_poison: every poison message into the archive."""
    client = rt.account.raw_queue(rt.settings.poison_queue)
    handled = 0
    while batch := list(client.receive_messages(max_messages=32, visibility_timeout=60)):
        for msg in batch:
            poison.handle_poison_message(
                message(base64.b64decode(msg.content), msg.dequeue_count, msg.id), rt
            )
            client.delete_message(msg)
            handled += 1
    return handled


def stored_text(rt: Runtime, container: str, skip: str | None = None) -> str:
    """Every blob of a container (but `skip`), as one text."""
    client = sdk(rt).container(container)
    parts = [
        client.download_blob(b.name).readall().decode("utf-8", "replace")
        for b in client.list_blobs()
        if b.name != skip
    ]
    return "\n".join(parts)


INTERNAL = ["ledger", "results", "payloads", "poison-archive", "azure-webjobs-secrets"]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("which", INTERNAL)
def test_an_internal_container_is_never_read_as_input(rt: Runtime, which: str, fmt: str) -> None:
    settings = rt.settings
    container = {
        "ledger": settings.ledger_container,
        "results": settings.results_container,
        "payloads": settings.payloads_container,
        "poison-archive": settings.poison_archive_container,
    }.get(which, which)
    if container == "azure-webjobs-secrets":
        with contextlib.suppress(ResourceExistsError):
            sdk(rt).blob.create_container(container)
    secret = f"SECRET-{uuid.uuid4().hex}"
    blob = f"planted-{uuid.uuid4().hex[:8]}.{fmt}"
    sdk(rt).container(container).upload_blob(blob, secret_blob(secret, fmt), overwrite=True)
    job_id = f"refused-{which}-{fmt}"

    process_message(message(job(job_id, container, blob, fmt)), rt)

    record = rt.ledger.get(job_id)
    assert record is not None and record.status == "poisoned"
    if which == "azure-webjobs-secrets":  # needs no settings: refused by payload validation
        expected = f"bad_payload: payload.input: container '{container}' {HOST_RULE}"
    else:
        setting = {
            "ledger": "LEDGER_CONTAINER",
            "results": "RESULTS_CONTAINER",
            "payloads": "PAYLOADS_CONTAINER",
            "poison-archive": "POISON_ARCHIVE_CONTAINER",
        }[which]
        expected = (
            f"input_refused: payload.input: container '{container}' is this app's {setting} "
            "(the app's own containers are never job input)"
        )
    assert record.data["reason"] == expected
    assert secret not in json.dumps(record.data)
    assert archive_poison_queue(rt) == 1
    [entry] = poison.list_poisoned(rt)
    assert entry.job_id == job_id and entry.reason == expected
    archive = settings.poison_archive_container
    assert secret not in stored_text(rt, archive, skip=blob if container == archive else None)
    ledger_text = stored_text(rt, settings.ledger_container, skip=blob)
    assert job_id in ledger_text and secret not in ledger_text
    results = sdk(rt).container(settings.results_container)
    assert not [b.name for b in results.list_blobs() if b.name != blob]  # no result, no Spark report


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_bad_value_is_quoted_from_the_callers_own_input_only(rt: Runtime, fmt: str) -> None:
    """The same blob in an allowed container: the error quotes the caller's own value (and only it)."""
    secret = f"SECRET-{uuid.uuid4().hex}"
    other = f"OTHER-{uuid.uuid4().hex}"
    sdk(rt).container(rt.settings.ledger_container).upload_blob("planted.csv", secret_blob(other, fmt))
    data = f"data{uuid.uuid4().hex[:10]}"
    sdk(rt).blob.create_container(data)
    try:
        sdk(rt).container(data).upload_blob(f"in.{fmt}", secret_blob(secret, fmt))
        process_message(message(job(f"bad-{fmt}", data, f"in.{fmt}", fmt)), rt)
        record = rt.ledger.get(f"bad-{fmt}")
        assert record is not None and record.status == "poisoned"
        assert record.data["reason"] == (
            f"bad_input_data: column 'v' has a value that is not a number on line "
            f"{2 if fmt == 'csv' else 1}: '{secret}'"
        )
        archive_poison_queue(rt)
        assert other not in json.dumps(record.data)
        assert other not in stored_text(rt, rt.settings.poison_archive_container)
    finally:
        sdk(rt).blob.delete_container(data)


def test_input_containers_narrows_the_inputs(azurite: Azurite) -> None:
    allowed = f"in{uuid.uuid4().hex[:10]}"
    other = f"other{uuid.uuid4().hex[:10]}"
    rt = runtime_for(azurite, HANDLERS, INPUT_CONTAINERS=allowed)
    for name in (allowed, other):
        sdk(rt).blob.create_container(name)
        sdk(rt).container(name).upload_blob("x.csv", b"k,v\na,1\n")
    try:
        process_message(message(job("narrow-ok", allowed, "x.csv", "csv")), rt)
        assert rt.ledger.get("narrow-ok").status == "completed"  # type: ignore[union-attr]
        process_message(message(job("narrow-no", other, "x.csv", "csv")), rt)
        record = rt.ledger.get("narrow-no")
        assert record is not None and record.status == "poisoned"
        assert record.data["reason"] == (
            f"input_refused: payload.input: container '{other}' is not in INPUT_CONTAINERS (allowed: {allowed})"
        )
    finally:
        for name in (allowed, other):
            sdk(rt).blob.delete_container(name)


# --- MAX_GROUPS --------------------------------------------------------------------------------


@pytest.fixture
def data_container(azurite: Azurite) -> Iterator[str]:
    from azure.storage.blob import BlobServiceClient

    name = f"data{uuid.uuid4().hex[:10]}"
    service = BlobServiceClient.from_connection_string(azurite.connection_string)
    service.create_container(name)
    yield name
    service.delete_container(name)


FOUR_GROUPS = b"k,v\na,1\nb,2\nc,3\nd,4\na,5\n"


def test_one_group_over_max_groups_is_poisoned_naming_the_limit(
    azurite: Azurite, data_container: str
) -> None:
    rt = runtime_for(azurite, HANDLERS, MAX_GROUPS="3")
    sdk(rt).container(data_container).upload_blob("four.csv", FOUR_GROUPS)
    process_message(message(job("cap-1", data_container, "four.csv", "csv")), rt)
    record = rt.ledger.get("cap-1")
    assert record is not None and record.status == "poisoned"
    assert record.data["reason"] == (
        "over_limit: the input has more than MAX_GROUPS=3 groups (group_by: k; 4 found before stopping): "
        "narrow group_by, raise MAX_GROUPS, or configure a Spark backend (SPARK_BACKEND) and use engine 'auto'"
    )
    assert record.data["reason_code"] == "over_limit"
    rt4 = runtime_for(azurite, HANDLERS, MAX_GROUPS="4")
    sdk(rt4).container(data_container).upload_blob("four.csv", FOUR_GROUPS, overwrite=True)
    process_message(message(job("cap-2", data_container, "four.csv", "csv")), rt4)
    assert rt4.ledger.get("cap-2").data["summary"]["groups"] == 4  # type: ignore[union-attr]


@pytest.fixture
def master() -> Iterator[FakeStandalone]:
    server = FakeStandalone()
    yield server
    server.stop()


def spark_runtime(azurite: Azurite, master: FakeStandalone, **extra: str) -> Runtime:
    return runtime_for(
        azurite,
        HANDLERS,
        SPARK_BACKEND="standalone",
        SPARK_URL=master.url,
        SPARK_JOB_FILE="/jobs/aggregate_job.py",
        SPARK_MASTER_URL="spark://127.0.0.1:7077",
        SPARK_MASTER_UI_URL=master.url,
        SPARK_PYTHON="/venv/bin/python",
        **extra,
    )


def test_over_max_groups_goes_to_spark_when_a_backend_is_configured(
    azurite: Azurite, data_container: str, master: FakeStandalone
) -> None:
    rt = spark_runtime(azurite, master, MAX_GROUPS="3")
    sdk(rt).container(data_container).upload_blob("four.csv", FOUR_GROUPS)
    body = job("cap-spark", data_container, "four.csv", "csv")
    process_message(message(body), rt)

    record = rt.ledger.get("cap-spark")
    assert record is not None and record.status == "offloaded"
    state = record.data["continuation"]["state"]
    assert state["reason"] == "max_groups" and state["backend"] == "standalone"
    [driver] = master.drivers.values()
    args = driver["body"]["appArgs"]
    at = args.index("cap-spark")  # after the script: job id, then the payload (base64 JSON)
    assert json.loads(base64.urlsafe_b64decode(args[at + 1])) == body["payload"]
    assert drain_raw(rt, rt.settings.jobs_queue) == []  # the status check waits SPARK_POLL_INITIAL_SECONDS

    # The run finishes with more groups than the function reads whole: its result is checked at
    # its two ends only, and the API refuses to serve it.
    driver["state"] = "FINISHED"
    rows = [{"k": f"key-{i:06d}", "count": 1, "sum_v": float(i)} for i in range(3000)]
    doc = {"id": "cap-spark", "rows": rows, "input_rows": 3000, "engine": "spark", "elapsed_s": 12.5}
    raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    assert len(raw) > result_limit_bytes(3)
    sdk(rt).container(rt.settings.results_container).upload_blob("cap-spark.json", raw)
    process_message(message({**body, "continuation_seq": 1}), rt)
    record = rt.ledger.get("cap-spark")
    assert record is not None and record.status == "completed"
    summary = record.data["summary"]
    assert summary["offload_reason"] == "max_groups" and summary["input_rows"] == 3000
    assert summary["engine"] == "spark" and summary["engine_elapsed_s"] == 12.5
    assert summary["groups"] is None and summary["result_bytes"] == len(raw)

    status, answer = get_result(rt, "cap-spark")
    assert status == 502
    assert answer["error"] == (
        f"result {rt.settings.results_container}/cap-spark.json of job cap-spark is {len(raw)} bytes, "
        f"more than this API serves ({result_limit_bytes(3)} bytes: MAX_GROUPS x 512 bytes a row + 64 KiB); "
        "read the blob from storage directly"
    )


def test_inline_engine_over_max_groups_is_not_sent_to_spark(
    azurite: Azurite, data_container: str, master: FakeStandalone
) -> None:
    rt = spark_runtime(azurite, master, MAX_GROUPS="3")
    sdk(rt).container(data_container).upload_blob("four.csv", FOUR_GROUPS)
    process_message(message(job("cap-inline", data_container, "four.csv", "csv", engine="inline")), rt)
    record = rt.ledger.get("cap-inline")
    assert record is not None and record.status == "poisoned"
    assert "MAX_GROUPS=3" in record.data["reason"] and "use engine 'auto' or 'spark'" in record.data["reason"]
    assert master.drivers == {}


# --- capped reads ------------------------------------------------------------------------------


def get_result(rt: Runtime, job_id: str) -> tuple[int, dict[str, Any]]:
    req = func.HttpRequest(
        method="GET", url=f"http://localhost/api/jobs/{job_id}/result", body=b"", route_params={"id": job_id}
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "get_runtime", lambda: rt)
        resp = api.get_result(req)
    return resp.status_code, json.loads(resp.get_body())


def test_result_reads_are_capped_by_what_max_groups_implies(azurite: Azurite) -> None:
    rt = runtime_for(azurite, HANDLERS, MAX_GROUPS="3")
    limit = result_limit_bytes(3)
    results = sdk(rt).container(rt.settings.results_container)
    for job_id, size in (("fits", limit), ("too-big", limit + 1)):
        text = json.dumps({"id": job_id, "rows": [], "pad": ""})
        raw = text[:-2].encode() + b"x" * (size - len(text)) + b'"}'
        assert len(raw) == size
        results.upload_blob(f"{job_id}.json", raw)
        rt.ledger.create(
            job_id,
            {"id": job_id, "status": "completed", "result_ref": f"{results.container_name}/{job_id}.json"},
        )
    status, answer = get_result(rt, "fits")
    assert status == 200 and answer["id"] == "fits"
    status, answer = get_result(rt, "too-big")
    assert status == 502 and answer["result_bytes"] == limit + 1 and answer["limit_bytes"] == limit
    assert "more than this API serves" in answer["error"]


def test_a_claim_checked_payload_over_max_payload_bytes_is_not_read(azurite: Azurite) -> None:
    rt = runtime_for(azurite, HANDLERS, MAX_PAYLOAD_BYTES="1024")
    payload = {"input": "data/x.csv", "format": "csv", "metrics": [{"op": "count"}], "pad": "y" * 5000}
    sdk(rt).container(rt.settings.payloads_container).upload_blob("big/p.json", json.dumps(payload))
    process_message(message({"id": "big-payload", "kind": "aggregate", "payload_ref": "big/p.json"}), rt)
    record = rt.ledger.get("big-payload")
    assert record is not None and record.status == "poisoned"
    size = len(json.dumps(payload))
    assert record.data["reason"] == (
        f"over_limit: payload_ref: blob {rt.settings.payloads_container}/big/p.json is {size} bytes, "
        "over MAX_PAYLOAD_BYTES=1024: not read"
    )
