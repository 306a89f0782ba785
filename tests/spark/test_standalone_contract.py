"""Standalone REST backend against a fake master (REST API, master JSON, worker log endpoint)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterator

import pytest

from shared.core.errors import DownstreamUnavailable, PermanentError
from shared.spark.backends import spark_from_env
from shared.spark.model import SparkJobRequest
from shared.spark.standalone import StandaloneBackend, driver_error_from_log, jws_token
from tests.spark.fakes import FakeStandalone, Reply

SECRET_CONN = (
    "DefaultEndpointsProtocol=http;AccountName=dev;AccountKey=c2VjcmV0LWtleQ==;BlobEndpoint=http://x"
)
JOB = SparkJobRequest(
    job_id="job-1",
    submission=1,
    name="aggregate-job-1-s1",
    job_file="/repo/spark_jobs/aggregate_job.py",
    args=["job-1", "e30", "results", "--submission", "1"],
    env={"AZURE_STORAGE_CONNECTION_STRING": SECRET_CONN},
)


@pytest.fixture
def master() -> Iterator[FakeStandalone]:
    server = FakeStandalone()
    yield server
    server.stop()


def backend(server: FakeStandalone, read_timeout_s: float = 2.0, **extra: str) -> StandaloneBackend:
    settings = spark_from_env({
        "SPARK_BACKEND": "standalone", "SPARK_URL": server.url, "SPARK_JOB_FILE": JOB.job_file,
        "SPARK_CONNECT_TIMEOUT_SECONDS": "1", "SPARK_READ_TIMEOUT_SECONDS": str(read_timeout_s),
        "SPARK_MASTER_URL": "spark://127.0.0.1:7077", "SPARK_MASTER_UI_URL": server.url,
        "SPARK_PYTHON": "/venv/bin/python", **extra,
    })  # fmt: skip
    return StandaloneBackend(settings)


def test_create_body_as_the_reference_describes(master: FakeStandalone) -> None:
    sub = backend(master).submit(JOB)
    assert sub.submission_id == "driver-20260101000000-0000"
    body = master.requests[-1].body
    assert body["action"] == "CreateSubmissionRequest"
    assert body["appResource"] == "file:/repo/spark_jobs/aggregate_job.py"
    assert body["mainClass"] == "org.apache.spark.deploy.PythonRunner"
    assert body["appArgs"] == ["/repo/spark_jobs/aggregate_job.py", "", *JOB.args]
    props = body["sparkProperties"]
    assert props["spark.master"] == "spark://127.0.0.1:7077"
    assert props["spark.submit.deployMode"] == "cluster"
    assert props["spark.app.name"] == JOB.name
    assert props["spark.pyspark.python"] == "/venv/bin/python"
    assert body["environmentVariables"]["AZURE_STORAGE_CONNECTION_STRING"] == SECRET_CONN


def test_the_storage_secret_travels_only_in_environment_variables(master: FakeStandalone) -> None:
    backend(master).submit(JOB)
    body = master.requests[-1].body
    visible = json.dumps({k: v for k, v in body.items() if k != "environmentVariables"})
    assert "AccountKey" not in visible and "c2VjcmV0LWtleQ" not in visible
    assert "AccountKey" not in repr(JOB)


def test_http_app_resource_uses_the_bare_file_name(master: FakeStandalone) -> None:
    job = SparkJobRequest(
        "j", 1, "n", "http://files/aggregate_job.py", ["a"], py_files=["http://files/e.zip"]
    )
    backend(master).submit(job)
    body = master.requests[-1].body
    assert body["appResource"] == "http://files/aggregate_job.py"
    assert body["appArgs"][:2] == ["aggregate_job.py", "http://files/e.zip"]
    assert body["sparkProperties"]["spark.submit.pyFiles"] == "http://files/e.zip"
    assert body["sparkProperties"]["spark.files"] == "http://files/e.zip"  # the executors' copy


@pytest.mark.parametrize(
    ("driver_state", "expected"),
    [("SUBMITTED", "pending"), ("RUNNING", "running"), ("RELAUNCHING", "pending"), ("UNKNOWN", "pending"),
     ("FINISHED", "succeeded"), ("FAILED", "failed"), ("ERROR", "failed"), ("KILLED", "failed")],
)  # fmt: skip
def test_states(master: FakeStandalone, driver_state: str, expected: str) -> None:
    b = backend(master)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    master.drivers[sid]["state"] = driver_state
    assert b.status(sid).state == expected


def test_an_id_the_master_does_not_know_is_unknown(master: FakeStandalone) -> None:
    status = backend(master).status("driver-gone")
    assert status.state == "unknown"


def test_failed_driver_reports_the_python_error_from_the_worker_log(master: FakeStandalone) -> None:
    b = backend(master)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    master.drivers[sid]["state"] = "FAILED"
    master.drivers[sid]["log"] += (
        "Traceback (most recent call last):\nValueError: bad thing happened\nINFO shutdown\n"
    )
    assert b.status(sid).message == "ValueError: bad thing happened"


def test_read_timeout_on_create_finds_the_driver_by_app_name_without_a_second_create(
    master: FakeStandalone,
) -> None:
    master.create_delay_s = 1.5
    b = backend(master, read_timeout_s=0.5)
    backend(master).submit(SparkJobRequest("other", 1, "aggregate-other-s1", JOB.job_file, []))
    sub = b.submit(JOB)
    assert sub.submission_id == "driver-20260101000000-0001"
    assert master.count("POST", "/v1/submissions/create") == 2  # the other job's and ours, once
    assert master.count("GET", "/json/") == 1


def test_find_waits_for_a_newer_driver_that_has_not_started(master: FakeStandalone) -> None:
    b = backend(master)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    launched = master.drivers[sid]["log"]
    master.drivers[sid].update(state="SUBMITTED", worker=None, log="")  # queued for a worker
    with pytest.raises(DownstreamUnavailable, match=f"{sid} have not started"):
        b.find(JOB)
    master.drivers[sid].update(state="RUNNING", worker="worker-1", log=launched)
    found = b.find(JOB)
    assert found is not None and found.submission_id == sid


def test_find_ignores_other_started_drivers_and_finished_ones_without_a_log(master: FakeStandalone) -> None:
    b = backend(master)
    other = b.submit(SparkJobRequest("other", 1, "aggregate-other-s1", JOB.job_file, [])).submission_id
    never_ran = b.submit(SparkJobRequest("x", 1, "aggregate-x-s1", JOB.job_file, [])).submission_id
    assert other and never_ran
    master.drivers[never_ran].update(state="ERROR", worker=None, log="")
    assert b.find(JOB) is None


def test_read_timeout_when_nothing_was_created_is_unconfirmed(master: FakeStandalone) -> None:
    master.create_delay_s = 1.5
    master.create_forwards = False
    sub = backend(master, read_timeout_s=0.5).submit(JOB)
    assert sub.submission_id is None
    assert master.count("POST", "/v1/submissions/create") == 1


def test_master_not_alive_is_transient_other_refusals_permanent(master: FakeStandalone) -> None:
    b = backend(master)
    not_alive = {
        "success": False,
        "message": "Can only accept driver submissions in ALIVE state. Current state: RECOVERING.",
    }
    master.canned = [Reply(200, not_alive), Reply(200, {"success": False, "message": "bad"})]
    with pytest.raises(DownstreamUnavailable, match="ALIVE"):
        b.submit(JOB)
    with pytest.raises(PermanentError, match="refused"):
        b.submit(JOB)


def test_wrong_url_is_a_permanent_error(master: FakeStandalone) -> None:
    b = backend(master)
    b.url = master.url + "/wrong"
    with pytest.raises(PermanentError, match="HTTP 468"):
        b.submit(JOB)


def _verify(secret: str) -> object:
    key = base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4))

    def check(token: str) -> bool:
        head, payload, sig = token.split(".")
        want = base64.urlsafe_b64encode(hmac.new(key, f"{head}.{payload}".encode(), hashlib.sha256).digest())
        return hmac.compare_digest(want.rstrip(b"=").decode(), sig)

    return check


def test_jws_bearer_token_for_the_jwsfilter() -> None:
    secret = base64.urlsafe_b64encode(b"k" * 32).decode().rstrip("=")
    server = FakeStandalone(jws_check=_verify(secret))  # type: ignore[arg-type]
    try:
        with pytest.raises(PermanentError, match="403"):
            backend(server).submit(JOB)
        sub = backend(server, SPARK_REST_AUTH_SECRET=secret).submit(JOB)
        assert sub.confirmed
        errors = [r for r in server.requests if "Authorization" in r.headers]
        assert errors and secret not in json.dumps([r.body for r in errors])
    finally:
        server.stop()


def test_jws_token_shape() -> None:
    token = jws_token(base64.urlsafe_b64encode(b"x" * 32).decode(), 1_700_000_000)
    head = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert head == {"alg": "HS256", "typ": "JWT"}


def test_driver_error_from_log_picks_the_last_exception_line() -> None:
    log = "INFO a\nTraceback:\n  File x\nKeyError: 'k'\nshared.core.errors.InputDataError: column 'v' bad\nINFO b\n"
    assert driver_error_from_log(log) == "shared.core.errors.InputDataError: column 'v' bad"
    assert driver_error_from_log("INFO nothing\n") == ""
