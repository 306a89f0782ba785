"""Real runs on a real standalone cluster (REST submission) reading from a real Azurite.

Each Spark run takes ~20-40 s here, so the scenarios share runs where they can:
- end to end: results equal to the inline engine and to an independent computation; a
  redelivery during the live run polls the same driver; a crash between submit and ledger
  write finds the driver instead of submitting again;
- the master killed mid-job and down for a while: failed status checks are counted, never an
  attempt; the restarted master has forgotten the driver, so it is resubmitted once and the
  result is written once;
- a job poisoned while offloaded: its driver is killed on the cluster;
- a failing job: the driver's error (column, value, line) comes back as InputDataError;
- a read timeout on submit (through a slow proxy): the driver is looked up, not duplicated;
- JSON lines end to end: equal to the inline engine and to an independent computation.
- a Parquet output (issue 37): the driver writes the blob in staged blocks, the document names it,
  its rows are the inline engine's.
"""

from __future__ import annotations

import csv
import io
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from devstack import datagen
from devstack.azurite import Azurite
from devstack.spark_cluster import SparkCluster
from shared.config.settings import Settings
from shared.core.errors import InputDataError
from shared.jobs.base import Completed, Continue, JobContext, Outcome
from shared.jobs.offload.aggregate_spark import abandon, offload, resume
from shared.spark.backends import make_backend
from shared.spark.model import SparkBackend
from shared.storage.accounts import AzureAccount
from shared.storage.clients import StorageClients
from tests.spark.helpers import (
    assert_rows_equal,
    follow,
    inline_result,
    make_ctx,
    settings_for,
    storage_for,
    upload,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration]

PAYLOAD: dict[str, Any] = {
    "format": "csv",
    "group_by": ["region", "product"],
    "metrics": [
        {"op": "count"},
        {"op": "sum", "column": "qty"},
        {"op": "mean", "column": "price"},
        {"op": "max", "column": "price"},
        {"op": "count", "column": "note"},
    ],
    "engine": "spark",
}


@pytest.fixture(scope="module")
def sales() -> bytes:
    return "".join(datagen.csv_lines(40_000, seed=21)).encode()


@pytest.fixture
def stack(azurite: Azurite, spark_cluster: SparkCluster) -> tuple[Settings, StorageClients, SparkBackend]:
    settings = settings_for(azurite, spark_cluster.env(), SPARK_SPLIT_MB="0.25", SPARK_MAX_SUBMISSIONS="2")
    return settings, storage_for(settings), make_backend(settings.spark)


def independent(data: bytes) -> dict[tuple[str | None, str | None], tuple[int, float]]:
    """count and sum(qty) per (region, product) with a plain csv loop: the reference."""
    out: dict[tuple[str | None, str | None], tuple[int, float]] = {}
    for row in csv.DictReader(io.StringIO(data.decode())):
        key = (row["region"] or None, row["product"] or None)
        count, total = out.get(key, (0, 0.0))
        qty = row["qty"]
        out[key] = (count + 1, total + (float(qty) if qty not in ("", "NA") else 0.0))
    return out


def drivers_named(cluster: SparkCluster, name: str) -> list[str]:
    """Ids of the drivers the master launched with this app name (from their launch commands)."""
    marker = f'"-Dspark.app.name={name}"'
    return [d["id"] for d in cluster.drivers() if marker in cluster.driver_log(d["id"], "stderr")]


def result_doc(settings: Settings, storage: StorageClients, job_id: str) -> tuple[dict[str, Any], str]:
    blob = storage.blob.get_blob_client(settings.results_container, f"{job_id}.json")
    download = blob.download_blob()
    return json.loads(download.readall()), str(download.properties.etag)


def until_confirmed(
    ctx: JobContext, outcome: Outcome, backend: SparkBackend, timeout_s: float = 60
) -> Continue:
    """Follow an unconfirmed submission (the backend could not tell yet whether it exists) with
    status checks, as continuation messages would, until the run is found."""
    deadline = time.monotonic() + timeout_s
    while isinstance(outcome, Continue) and outcome.state["submission_id"] is None:
        assert outcome.state["submissions"] == 1  # looking, never submitting again
        if time.monotonic() > deadline:
            raise TimeoutError(f"still unconfirmed after {timeout_s:.0f}s")
        time.sleep(0.5)
        ctx.resume_state = outcome.state
        outcome = resume(ctx, backend=backend)
    assert isinstance(outcome, Continue)
    return outcome


def wait_for(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise TimeoutError(what)


def test_end_to_end_equals_inline_and_redelivery_polls_the_same_driver(
    stack: tuple[Settings, StorageClients, SparkBackend], spark_cluster: SparkCluster, sales: bytes
) -> None:
    settings, storage, backend = stack
    payload = {**PAYLOAD, "input": upload(storage, "inputs", "sales-e2e.csv", sales)}
    ctx = make_ctx(settings, storage, payload)
    first = offload(ctx, backend=backend)
    assert isinstance(first, Continue)
    sid = first.state["submission_id"]
    name = first.state["name"]

    # A redelivered continuation while the run is live: polls, does not submit.
    ctx.resume_state = first.state
    polled = resume(ctx, backend=backend)
    assert isinstance(polled, Continue) and polled.state["submission_id"] == sid
    # The process died after submitting but before the ledger saved Continue: the retry finds it.
    crashed = make_ctx(
        settings, storage, payload, ctx.job_id, attempt=1, progress={"spark_submitting": {"name": name}}
    )
    again = until_confirmed(crashed, offload(crashed, backend=backend), backend)
    assert isinstance(again, Continue) and again.state["submission_id"] == sid

    done, _ = follow(ctx, polled, backend)
    assert isinstance(done, Completed)
    assert done.summary["engine"] == "spark" and done.summary["submissions"] == 1
    doc, _ = result_doc(settings, storage, ctx.job_id)
    assert doc["id"] == ctx.job_id and doc["engine"] == "spark" and doc["input_rows"] == 40_000
    assert_rows_equal(doc["rows"], inline_result(sales, payload))
    reference = independent(sales)
    got = {(r["region"], r["product"]): (r["count"], r["sum_qty"] or 0.0) for r in doc["rows"]}
    assert got.keys() == reference.keys()
    for key, (count, total) in reference.items():
        assert got[key][0] == count and got[key][1] == pytest.approx(total, rel=1e-9)
    assert drivers_named(spark_cluster, name) == [sid]


def test_master_down_then_restarted_mid_job_resubmits_once_and_writes_once(
    stack: tuple[Settings, StorageClients, SparkBackend], spark_cluster: SparkCluster, sales: bytes
) -> None:
    settings, storage, backend = stack
    payload = {**PAYLOAD, "input": upload(storage, "inputs", "sales-kill.csv", sales)}
    ctx = make_ctx(settings, storage, payload)
    first = offload(ctx, backend=backend)
    assert isinstance(first, Continue)
    sid = str(first.state["submission_id"])
    wait_for(lambda: backend.status(sid).state == "running", 60, "driver running")
    # Killed while the driver runs. The driver cannot get executors until the worker re-registers
    # with the new master, and at that moment the new master has the unknown driver killed: the
    # first run cannot finish, so the outcome does not depend on timing.
    spark_cluster.kill_master()
    # While the master is down, status checks fail: they are counted, never an attempt.
    outcome: Outcome = first
    for n in (1, 2):
        assert isinstance(outcome, Continue)
        ctx.resume_state = outcome.state
        outcome = resume(ctx, backend=backend)
        assert isinstance(outcome, Continue) and outcome.state["poll_failures"] == n
        assert outcome.state["submission_id"] == sid and outcome.state["submissions"] == 1
    spark_cluster.revive_master()

    assert isinstance(outcome, Continue)
    ctx.resume_state = outcome.state
    after = resume(ctx, backend=backend)
    assert isinstance(after, Continue)
    assert after.state["submissions"] == 2 and after.state["submission_id"] != sid
    done, states = follow(ctx, after, backend)
    assert isinstance(done, Completed) and done.summary["submissions"] == 2
    assert {s["submissions"] for s in states} == {2}
    doc, etag = result_doc(settings, storage, ctx.job_id)
    assert_rows_equal(doc["rows"], inline_result(sales, payload))
    # Whatever became of the first driver, nothing rewrites the result afterwards.
    wait_for(lambda: spark_cluster.running_driver_processes() == 0, 90, "drivers finished")
    assert result_doc(settings, storage, ctx.job_id)[1] == etag
    assert len(drivers_named(spark_cluster, f"aggregate-{ctx.job_id}-s2")) == 1


def test_poisoned_job_has_its_driver_killed(
    stack: tuple[Settings, StorageClients, SparkBackend], sales: bytes
) -> None:
    settings, storage, backend = stack
    payload = {**PAYLOAD, "input": upload(storage, "inputs", "sales-poison.csv", sales)}
    ctx = make_ctx(settings, storage, payload)
    first = offload(ctx, backend=backend)
    assert isinstance(first, Continue)
    sid = str(first.state["submission_id"])
    wait_for(lambda: backend.status(sid).state == "running", 60, "driver running")
    run = abandon(settings, AzureAccount(storage, settings.storage), ctx.job_id, first.state, backend=backend)
    assert run is not None and run["cancelled"] is True and run["submission_id"] == sid
    wait_for(lambda: backend.status(sid).raw_state == "KILLED", 60, "driver killed")


def test_failing_job_reports_the_drivers_error(stack: tuple[Settings, StorageClients, SparkBackend]) -> None:
    settings, storage, backend = stack
    lines = ["k,v"] + [f"g{i % 5},{i}" for i in range(20_000)]
    lines[15_001] = "g3,twelve"
    ref = upload(storage, "inputs", "bad.csv", ("\n".join(lines) + "\n").encode())
    payload = {"input": ref, "format": "csv", "group_by": ["k"], "metrics": [{"op": "sum", "column": "v"}]}
    ctx = make_ctx(settings, storage, payload)
    out = offload(ctx, backend=backend)
    with pytest.raises(InputDataError) as info:
        follow(ctx, out, backend)
    message = str(info.value)
    assert "'v'" in message and "'twelve'" in message and "line 15002" in message
    assert "after 1 submission" in message  # bad data: a new run cannot help, so none is made


class SlowProxy:
    """Forwards to the REST API, then holds the answer back for `delay_s` (past the read timeout)."""

    def __init__(self, target: str, delay_s: float) -> None:
        outer = self
        self.creates = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                resp = requests.request(self.command, target + self.path, data=body or None,
                                        headers={"Content-Type": "application/json"}, timeout=30)  # fmt: skip
                if self.path.endswith("/create"):
                    outer.creates += 1
                    time.sleep(delay_s)
                try:
                    self.send_response(resp.status_code)
                    self.send_header("Content-Length", str(len(resp.content)))
                    self.end_headers()
                    self.wfile.write(resp.content)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = _forward

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def slow_proxy(spark_cluster: SparkCluster) -> Iterator[SlowProxy]:
    proxy = SlowProxy(spark_cluster.rest_url, delay_s=4.0)
    yield proxy
    proxy.stop()


def test_read_timeout_on_submit_looks_the_driver_up_instead_of_submitting_again(
    azurite: Azurite, spark_cluster: SparkCluster, slow_proxy: SlowProxy, sales: bytes
) -> None:
    env = {**spark_cluster.env(), "SPARK_URL": slow_proxy.url, "SPARK_READ_TIMEOUT_SECONDS": "1.5",
           "SPARK_DOWNSTREAM_TIMEOUT_SECONDS": "1"}  # fmt: skip
    settings = settings_for(azurite, env)
    storage = storage_for(settings)
    backend = make_backend(settings.spark)
    payload = {**PAYLOAD, "input": upload(storage, "inputs", "sales-timeout.csv", sales)}
    ctx = make_ctx(settings, storage, payload)
    t0 = time.monotonic()
    out = offload(ctx, backend=backend)
    assert isinstance(out, Continue)
    assert time.monotonic() - t0 < 10
    state = out.state
    if state["submission_id"] is None:  # not launched yet when we looked: the next check finds it
        time.sleep(2)
        ctx.resume_state = state
        nxt = resume(ctx, backend=backend)
        assert isinstance(nxt, Continue)
        state = nxt.state
    sid = state["submission_id"]
    assert sid is not None and state["submissions"] == 1
    assert slow_proxy.creates == 1
    assert drivers_named(spark_cluster, str(state["name"])) == [sid]
    backend.cancel(str(sid))  # no need to run it to the end
    wait_for(lambda: backend.status(str(sid)).state == "failed", 30, "driver killed")


def test_json_lines_end_to_end_equal_inline_and_an_independent_computation(
    stack: tuple[Settings, StorageClients, SparkBackend],
) -> None:
    """JSON lines on the cluster: the executors parse their splits with the engine's pyarrow
    JSON path (an integer group column, its keys as written, nulls)."""
    settings, storage, backend = stack
    data = "".join(datagen.wide_jsonl_lines(20_000, seed=4)).encode()
    payload = {
        "input": upload(storage, "inputs", "wide-e2e.jsonl", data),
        "format": "jsonl",
        "group_by": ["kind", "humidity"],
        "metrics": [
            {"op": "count"},
            {"op": "sum", "column": "precip"},
            {"op": "mean", "column": "temp"},
            {"op": "max", "column": "wind_speed"},
        ],
        "engine": "spark",
    }
    ctx = make_ctx(settings, storage, payload)
    done, _ = follow(ctx, offload(ctx, backend=backend), backend)
    assert isinstance(done, Completed)
    doc, _ = result_doc(settings, storage, ctx.job_id)
    assert doc["engine"] == "spark" and doc["input_rows"] == 20_000
    assert_rows_equal(doc["rows"], inline_result(data, payload))
    reference: dict[tuple[str, str | None], tuple[int, float]] = {}
    for line in data.splitlines():
        record = json.loads(line)
        humidity = None if record["humidity"] is None else str(record["humidity"])
        count, total = reference.get((record["kind"], humidity), (0, 0.0))
        reference[(record["kind"], humidity)] = (count + 1, total + (record["precip"] or 0.0))
    got = {(r["kind"], r["humidity"]): (r["count"], r["sum_precip"] or 0.0) for r in doc["rows"]}
    assert got.keys() == reference.keys()
    for key, (count, total) in reference.items():
        assert got[key][0] == count and got[key][1] == pytest.approx(total, rel=1e-9)


def test_a_parquet_output_is_written_by_the_driver_and_named_by_the_document(
    stack: tuple[Settings, StorageClients, SparkBackend], sales: bytes
) -> None:
    """output.format parquet on the cluster: the driver writes the rows in staged blocks beside the
    document, which names the blob; its rows are the inline engine's (issue 37)."""
    import pyarrow.parquet as pq

    settings, storage, backend = stack
    payload = {
        **PAYLOAD,
        "input": upload(storage, "inputs", "sales-parquet.csv", sales),
        "output": {"format": "parquet"},
    }
    ctx = make_ctx(settings, storage, payload)
    done, _ = follow(ctx, offload(ctx, backend=backend), backend)
    assert isinstance(done, Completed)
    doc, _ = result_doc(settings, storage, ctx.job_id)
    ref = f"{settings.results_container}/{ctx.job_id}.v0.parquet"
    assert doc["engine"] == "spark" and doc["input_rows"] == 40_000 and "rows" not in doc
    blob = storage.blob.get_blob_client(settings.results_container, f"{ctx.job_id}.v0.parquet")
    raw = blob.download_blob().readall()
    assert doc["output"]["result_ref"] == ref and doc["output"]["bytes"] == len(raw)
    assert done.summary["output"] == {"format": "parquet", "result_ref": ref, "bytes": len(raw)}
    table = pq.read_table(io.BytesIO(raw))
    assert doc["output"]["rows"] == done.summary["groups"] == table.num_rows
    assert [c["name"] for c in doc["output"]["columns"]] == table.column_names
    assert_rows_equal(table.to_pylist(), inline_result(sales, payload))
    committed, uncommitted = blob.get_block_list("all")
    assert len(committed) >= 1 and uncommitted == []
