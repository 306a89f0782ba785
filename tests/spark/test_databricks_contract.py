"""Databricks backend against a local server that answers as Jobs API 2.2 is documented."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.core.errors import DownstreamUnavailable, PermanentError, SettingsError
from shared.spark.backends import spark_from_env
from shared.spark.databricks import DatabricksBackend, idempotency_token
from shared.spark.model import SparkJobRequest
from tests.spark.fakes import FakeDatabricks

PAT = "dapi0123456789abcdef0123"
JOB = SparkJobRequest(
    job_id="job-1",
    submission=1,
    name="aggregate-job-1-s1",
    job_file="abfss://jobs@acct.dfs.core.windows.net/aggregate_job.py",
    args=["job-1", "e30", "results"],
)


@pytest.fixture
def dbx() -> Iterator[FakeDatabricks]:
    server = FakeDatabricks(token=PAT)
    yield server
    server.stop()


def backend(server: FakeDatabricks, read_timeout_s: float = 2.0, token: str = PAT) -> DatabricksBackend:
    settings = spark_from_env({
        "SPARK_BACKEND": "databricks", "SPARK_URL": server.url, "SPARK_JOB_FILE": JOB.job_file,
        "SPARK_CONNECT_TIMEOUT_SECONDS": "1", "SPARK_READ_TIMEOUT_SECONDS": str(read_timeout_s),
        "SPARK_DOWNSTREAM_TIMEOUT_SECONDS": "0.1", "SPARK_DATABRICKS_AUTH": "token",
        "SPARK_DATABRICKS_TOKEN": token, "SPARK_DATABRICKS_CLUSTER_ID": "0101-abc",
    })  # fmt: skip
    b = DatabricksBackend(settings)
    b.http.sleep = lambda s: None
    return b


def test_submit_sends_token_task_and_idempotency_token(dbx: FakeDatabricks) -> None:
    sub = backend(dbx).submit(JOB)
    assert sub.submission_id == "1001"
    body = dbx.requests[-1].body
    assert body["idempotency_token"] == "job-1:s1"
    assert body["run_name"] == JOB.name
    task = body["tasks"][0]
    assert task["spark_python_task"] == {"python_file": JOB.job_file, "parameters": list(JOB.args)}
    assert task["existing_cluster_id"] == "0101-abc"


def test_long_job_ids_give_a_bounded_deterministic_token() -> None:
    long_id = "x" * 128
    a, b = idempotency_token(long_id, 2), idempotency_token(long_id, 2)
    assert a == b and len(a) <= 64 and a.endswith(":s2")
    assert idempotency_token(long_id, 3) != a


@pytest.mark.parametrize(
    ("life", "result", "expected"),
    [("PENDING", None, "pending"), ("QUEUED", None, "pending"), ("RUNNING", None, "running"),
     ("TERMINATING", None, "running"), ("TERMINATED", "SUCCESS", "succeeded"),
     ("TERMINATED", "FAILED", "failed"), ("TERMINATED", "CANCELED", "failed"),
     ("TERMINATED", "TIMEDOUT", "failed"), ("INTERNAL_ERROR", "FAILED", "failed"), ("SKIPPED", None, "failed")],
)  # fmt: skip
def test_states(dbx: FakeDatabricks, life: str, result: str | None, expected: str) -> None:
    b = backend(dbx)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    dbx.set_state(int(sid), life, result)
    assert b.status(sid).state == expected


def test_failed_run_carries_the_task_error(dbx: FakeDatabricks) -> None:
    b = backend(dbx)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    dbx.set_state(int(sid), "TERMINATED", "FAILED", "Task aggregate failed with message: Workload failed")
    dbx.outputs[int(sid) * 10] = {"error": "InputDataError: column 'v' is bad", "error_trace": "..."}
    status = b.status(sid)
    assert status.state == "failed"
    assert "InputDataError: column 'v' is bad" in status.message
    assert "TERMINATED/FAILED" in status.message


def test_unknown_run_is_forgotten(dbx: FakeDatabricks) -> None:
    b = backend(dbx)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    dbx.forget(int(sid))
    assert b.status(sid).state == "unknown"


def test_read_timeout_retries_with_the_same_token_and_gets_the_same_run(dbx: FakeDatabricks) -> None:
    dbx.submit_delay_s = [1.5]  # the first submit creates the run but answers too late
    sub = backend(dbx, read_timeout_s=0.5).submit(JOB)
    assert sub.submission_id == "1001"
    submits = [r for r in dbx.requests if r.path.endswith("/runs/submit")]
    assert len(submits) == 2
    assert {r.body["idempotency_token"] for r in submits} == {"job-1:s1"}
    assert len(dbx.runs) == 1


def test_timeouts_every_time_leave_it_unconfirmed_and_find_gets_the_run_later(dbx: FakeDatabricks) -> None:
    dbx.submit_delay_s = [1.5, 1.5]
    b = backend(dbx, read_timeout_s=0.5)
    sub = b.submit(JOB)
    assert sub.submission_id is None
    found = b.find(JOB)
    assert found is not None and found.submission_id == "1001"
    assert len(dbx.runs) == 1


def test_429_retry_after_is_honoured(dbx: FakeDatabricks) -> None:
    b = backend(dbx)
    slept: list[float] = []
    b.http.sleep = slept.append
    dbx.throttle = [3]
    assert b.submit(JOB).submission_id == "1001"
    assert slept == [3.0]


def test_429_beyond_the_bound_is_transient(dbx: FakeDatabricks) -> None:
    b = backend(dbx)
    dbx.throttle = [1, 1, 1]
    with pytest.raises(DownstreamUnavailable, match="429"):
        b.submit(JOB)
    assert len(dbx.runs) == 0


def test_bad_token_is_permanent_and_not_leaked(dbx: FakeDatabricks) -> None:
    wrong = "dapiffffffffffffffffffffffff"
    with pytest.raises(PermanentError, match="credentials rejected") as info:
        backend(dbx, token=wrong).submit(JOB)
    assert wrong not in str(info.value)


def test_invalid_request_is_permanent(dbx: FakeDatabricks) -> None:
    b = backend(dbx)
    b.cluster = {}
    body = b.submit_body(JOB)
    body["tasks"] = []
    with pytest.raises(PermanentError, match="INVALID_PARAMETER_VALUE"):
        b.http.request("POST", f"{b.base}/runs/submit", json=body)


def test_cancel(dbx: FakeDatabricks) -> None:
    b = backend(dbx)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    b.cancel(sid)
    assert b.status(sid).state == "failed"


def test_missing_cluster_setting_is_a_clear_configuration_error() -> None:
    env = {"SPARK_BACKEND": "databricks", "SPARK_URL": "http://127.0.0.1:9", "SPARK_JOB_FILE": "x",
           "SPARK_DATABRICKS_AUTH": "token", "SPARK_DATABRICKS_TOKEN": "t"}  # fmt: skip
    with pytest.raises(SettingsError, match="SPARK_DATABRICKS_CLUSTER_ID"):
        spark_from_env(env)
