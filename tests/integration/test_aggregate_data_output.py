"""Results as data (issue 37) on a real Azurite: a job posted with `output.format` parquet or csv
runs through the app (POST /api/jobs, the queue message, the handler reading over HTTP) and leaves
a data blob that pyarrow reads back with the right rows; GET /api/jobs/{id}/result names it; a
retried write leaves one correct blob."""

from __future__ import annotations

import base64
import csv
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import azure.functions as func
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from devstack.azurite import Azurite
from shared.aggregation import engine
from shared.aggregation.spill import ResultRows, SpillLimits
from shared.interfaces import api
from shared.jobs import aggregate as aggregate_job
from shared.jobs import aggregate_output
from shared.pipeline.processing import process_message
from shared.runtime.wiring import Runtime
from shared.storage import staged
from shared.storage.failures import StorageBusy
from tests.integration.helpers import message, runtime_for, sdk, unique

pytestmark = [pytest.mark.integration, pytest.mark.azurite]

ROWS = 30_000
GROUPS = 6_994  # k0000..k6999 but for the 7 ending in 007 (their rows have the empty key), and the null key


def input_csv() -> bytes:
    lines = ["k,v"]
    for i in range(ROWS):
        key = "" if i % 1000 == 7 else f"k{i % 7000:04d}"
        value = "" if i % 11 == 0 else f"{i % 97}.5"
        lines.append(f"{key},{value}")
    return ("\n".join(lines) + "\n").encode()


def expected_rows() -> list[dict[str, Any]]:
    """count, sum(v) per k with the csv module alone: the null key first, then in key order."""
    groups: dict[str | None, list[Any]] = {}
    for row in csv.DictReader(io.StringIO(input_csv().decode())):
        key = row["k"] or None
        count, total, seen = groups.setdefault(key, [0, 0.0, 0])
        has = row["v"] != ""
        groups[key] = [count + 1, total + (float(row["v"]) if has else 0.0), seen + has]
    order = sorted(groups, key=lambda k: (k is not None, k or ""))
    return [{"k": k, "count": groups[k][0], "sum_v": groups[k][1] if groups[k][2] else None} for k in order]


@pytest.fixture
def rt(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    runtime = runtime_for(azurite)
    monkeypatch.setattr(api, "get_runtime", lambda: runtime)
    data = unique("data")
    sdk(runtime).blob.create_container(data)
    sdk(runtime).container(data).upload_blob("sales.csv", input_csv())
    monkeypatch.setattr(aggregate_output, "BLOCK_BYTES", 16 * 1024)  # several blocks for a small result
    INPUT[runtime.settings.results_container] = f"{data}/sales.csv"
    yield runtime


INPUT: dict[str, str] = {}
"""Each test's input blob, by its runtime's results container."""


def payload(rt: Runtime, fmt: str, **extra: Any) -> dict[str, Any]:
    return {
        "input": INPUT[rt.settings.results_container],
        "format": "csv",
        "group_by": ["k"],
        "metrics": [{"op": "count"}, {"op": "sum", "column": "v"}],
        "engine": "inline",
        "output": {"format": fmt},
        **extra,
    }


def call(handler: Any, method: str, path: str, body: Any = None, job_id: str = "") -> tuple[int, Any]:
    raw = b"" if body is None else json.dumps(body).encode()
    req = func.HttpRequest(
        method=method, url=f"http://localhost{path}", body=raw, route_params={"id": job_id} if job_id else {}
    )
    resp = handler(req)
    text = resp.get_body()
    return resp.status_code, json.loads(text) if text else None


def run_job(rt: Runtime, body: dict[str, Any]) -> str:
    """POST the job, then deliver its one message as the host would."""
    status, answer = call(api.submit_job, "POST", "/api/jobs", body)
    assert status == 202, answer
    client = rt.account.raw_queue(rt.settings.jobs_queue)
    [msg] = list(client.receive_messages(max_messages=32, visibility_timeout=60))
    process_message(message(base64.b64decode(msg.content), msg_id=msg.id), rt)
    client.delete_message(msg)
    return str(answer["id"])


def blob_bytes(rt: Runtime, ref: str) -> bytes:
    container, _, name = ref.partition("/")
    return bytes(sdk(rt).container(container).download_blob(name).readall())


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_data_output_is_a_readable_blob_named_by_the_result(rt: Runtime, fmt: str) -> None:
    job_id = run_job(rt, {"id": unique("out-"), "kind": "aggregate", "payload": payload(rt, fmt)})
    status, record = call(api.get_job, "GET", f"/api/jobs/{job_id}", job_id=job_id)
    assert status == 200 and record["status"] == "completed", record
    results = rt.settings.results_container
    ref = f"{results}/{job_id}.v0.{fmt}"
    assert record["result_ref"] == f"{results}/{job_id}.json"
    assert record["summary"]["output"]["result_ref"] == ref and record["summary"]["groups"] == GROUPS

    status, document = call(api.get_result, "GET", f"/api/jobs/{job_id}/result", job_id=job_id)
    assert status == 200
    raw = blob_bytes(rt, ref)
    assert document["output"] == {
        "format": fmt,
        "result_ref": ref,
        "rows": GROUPS,
        "bytes": len(raw),
        "columns": [
            {"name": "k", "type": "string"},
            {"name": "count", "type": "int64"},
            {"name": "sum_v", "type": "double"},
        ],
    }
    assert "rows" not in document and document["input_rows"] == ROWS and document["engine"] == "inline"
    if fmt == "parquet":
        table = pq.read_table(io.BytesIO(raw))
        assert table.schema == pa.schema([("k", pa.string()), ("count", pa.int64()), ("sum_v", pa.float64())])
    else:
        types = {"k": pa.string(), "count": pa.int64(), "sum_v": pa.float64()}
        table = pacsv.read_csv(
            io.BytesIO(raw),
            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
        )
        # a null key is an empty unquoted field; pyarrow reads it back as null
    assert table.to_pylist() == expected_rows()
    props = sdk(rt).container(results).get_blob_client(f"{job_id}.v0.{fmt}").get_blob_properties()
    assert str(props.content_settings.content_type).startswith(
        {"parquet": "application/vnd.apache.parquet", "csv": "text/csv"}[fmt]
    )
    committed, uncommitted = (
        sdk(rt).container(results).get_blob_client(f"{job_id}.v0.{fmt}").get_block_list("all")
    )
    assert len(committed) > 1 and uncommitted == []  # staged in blocks (16 KiB here)


def test_a_result_that_spills_to_disk_is_the_same_blob(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Groups past the spill bound go to sorted runs on local disk (made small here), read back
    over HTTP; the blob has the same rows, and no run is left behind."""
    limits = SpillLimits(spill_rows=500, batch_rows=64, range_rows=400, max_runs=4, directory=str(tmp_path))
    spilled: list[bool] = []

    def small_runs(*args: Any, **kwargs: Any) -> ResultRows:
        result = engine.aggregate_rows(*args, limits=limits, **kwargs)
        spilled.append(result.spilled is not None)
        return result

    monkeypatch.setattr(aggregate_job, "aggregate_rows", small_runs)
    job_id = run_job(rt, {"id": unique("spill-"), "kind": "aggregate", "payload": payload(rt, "parquet")})
    status, record = call(api.get_job, "GET", f"/api/jobs/{job_id}", job_id=job_id)
    assert status == 200 and record["status"] == "completed", record
    assert spilled == [True] and record["summary"]["groups"] == GROUPS
    raw = blob_bytes(rt, f"{rt.settings.results_container}/{job_id}.v0.parquet")
    assert pq.read_table(io.BytesIO(raw)).to_pylist() == expected_rows()
    assert not list(tmp_path.iterdir())


def test_a_retried_write_leaves_one_correct_blob(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first run dies after staging blocks (before the commit): nothing is visible; the run
    the retry starts writes the same name, and the blob is whole, once, with no stray blocks."""
    body = {"id": unique("retry-"), "kind": "aggregate", "payload": payload(rt, "parquet")}
    real_commit = staged.StagedBlobWriter.commit
    calls: list[int] = []

    def dying_commit(self: staged.StagedBlobWriter) -> int:
        calls.append(self.blocks)
        if len(calls) == 1:
            raise StorageBusy("committing: storage busy (503)", 503)  # the commit never landed
        return real_commit(self)

    monkeypatch.setattr(staged.StagedBlobWriter, "commit", dying_commit)
    job_id = run_job(rt, body)
    results = sdk(rt).container(rt.settings.results_container)
    blob = results.get_blob_client(f"{job_id}.v0.parquet")
    assert calls and calls[0] > 1
    assert not blob.exists()  # staged only: not a blob yet
    assert len(blob.get_block_list("uncommitted")[1]) == calls[0]
    record = rt.ledger.get(job_id)
    assert record is not None and record.status != "completed"

    client = rt.account.raw_queue(rt.settings.jobs_queue)
    deadline = time.monotonic() + 120
    while True:  # the retry message (its backoff delay) and the second run
        batch = list(client.receive_messages(max_messages=1, visibility_timeout=60))
        if batch:
            msg = batch[0]
            process_message(message(base64.b64decode(msg.content), msg.dequeue_count, msg_id=msg.id), rt)
            client.delete_message(msg)
            record = rt.ledger.get(job_id)
            if record is not None and record.status == "completed":
                break
        assert time.monotonic() < deadline, "the retry never came"
        time.sleep(0.5)
    committed, uncommitted = blob.get_block_list("all")
    assert calls[1] == calls[0]  # the same full blocks staged again, the same ids
    assert len(committed) in (calls[1], calls[1] + 1) and uncommitted == []  # (+ the last, part-full)
    assert pq.read_table(io.BytesIO(blob.download_blob().readall())).to_pylist() == expected_rows()
    names = [b.name for b in results.list_blobs()]
    assert names == sorted([f"{job_id}.json", f"{job_id}.v0.parquet"])


def test_an_unknown_output_format_is_a_400_naming_the_field(rt: Runtime) -> None:
    status, answer = call(
        api.submit_job, "POST", "/api/jobs", {"kind": "aggregate", "payload": payload(rt, "xlsx")}
    )
    assert status == 400
    assert answer["problems"] == ["payload.output.format: 'xlsx' is not one of json, parquet, csv"]
