"""Livy backend against a local server that answers as the Livy batches API is documented."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.core.errors import DownstreamUnavailable, PermanentError, SettingsError
from shared.spark.backends import spark_from_env
from shared.spark.databricks import DatabricksBackend
from shared.spark.livy import LivyBackend
from shared.spark.model import SparkJobRequest
from shared.spark.standalone import StandaloneBackend
from shared.spark.transport import BudgetSpent, ReadTimedOut, remaining_budget, step_budget
from tests.spark.fakes import FakeLivy, Reply

JOB = SparkJobRequest(
    job_id="job-1",
    submission=1,
    name="aggregate-job-1-s1",
    job_file="abfss://jobs@acct.dfs.core.windows.net/aggregate_job.py",
    args=["job-1", "e30", "results", "--submission", "1"],
)


@pytest.fixture
def livy() -> Iterator[FakeLivy]:
    server = FakeLivy()
    yield server
    server.stop()


def backend(server: FakeLivy, read_timeout_s: float = 2.0, **extra: str) -> LivyBackend:
    settings = spark_from_env({
        "SPARK_BACKEND": "livy", "SPARK_URL": server.url, "SPARK_JOB_FILE": JOB.job_file,
        "SPARK_CONNECT_TIMEOUT_SECONDS": "1", "SPARK_READ_TIMEOUT_SECONDS": str(read_timeout_s),
        "SPARK_DOWNSTREAM_TIMEOUT_SECONDS": "0.1", "SPARK_LIVY_AUTH": "entra", **extra,
    })  # fmt: skip
    b = LivyBackend(settings, token_provider=lambda scope: "entra-token")
    b.http.sleep = lambda s: None
    return b


def test_submit_sends_name_tags_and_bearer_token(livy: FakeLivy) -> None:
    sub = backend(livy).submit(JOB)
    assert sub.submission_id == "0" and sub.confirmed
    create = livy.requests[-1]
    assert create.body["name"] == JOB.name
    assert create.body["tags"] == {"job_id": "job-1", "submission": "1"}
    assert create.body["file"] == JOB.job_file and create.body["args"] == list(JOB.args)
    assert create.headers["Authorization"] == "Bearer entra-token"
    assert create.headers["X-Requested-By"]


def test_synapse_answers_200_on_create(livy: FakeLivy) -> None:
    livy.create_status = 200
    assert backend(livy).submit(JOB).submission_id == "0"


@pytest.mark.parametrize(
    ("state", "expected"),
    [("not_started", "pending"), ("starting", "pending"), ("running", "running"),
     ("shutting_down", "running"), ("success", "succeeded"), ("dead", "failed"),
     ("killed", "failed"), ("error", "failed")],
)  # fmt: skip
def test_states(livy: FakeLivy, state: str, expected: str) -> None:
    b = backend(livy)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    livy.set_state(int(sid), state)
    assert b.status(sid).state == expected


def test_failed_batch_carries_the_driver_error_from_its_log(livy: FakeLivy) -> None:
    b = backend(livy)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    log = ["stdout: ", "Traceback (most recent call last):", "InputDataError: column 'v' is bad", "stderr: "]
    livy.set_state(int(sid), "dead", log)
    status = b.status(sid)
    assert status.state == "failed"
    assert "InputDataError: column 'v' is bad" in status.message


def test_404_after_retention_is_unknown(livy: FakeLivy) -> None:
    b = backend(livy)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    livy.forgotten.add(int(sid))
    status = b.status(sid)
    assert status.state == "unknown"
    assert "no longer knows" in status.message


def test_read_timeout_on_create_looks_up_by_name_and_never_creates_twice(livy: FakeLivy) -> None:
    livy.create_delay_s = 1.5  # the batch is created, the answer comes too late
    b = backend(livy, read_timeout_s=0.5)
    sub = b.submit(JOB)
    assert sub.submission_id == "0"
    assert livy.count("POST", "/batches") == 1
    assert livy.count("GET", "/batches") >= 1  # the lookup


def test_unfound_after_timeout_is_unconfirmed_not_retried(livy: FakeLivy) -> None:
    livy.create_delay_s = 1.5
    b = backend(livy, read_timeout_s=0.5)
    livy.forgotten.add(0)  # the lookup will not see the created batch
    sub = b.submit(JOB)
    assert sub.submission_id is None and not sub.confirmed
    assert livy.count("POST", "/batches") == 1


def test_duplicate_name_answer_adopts_the_existing_batch(livy: FakeLivy) -> None:
    b = backend(livy)
    first = b.submit(JOB)
    again = b.submit(JOB)  # e.g. a redelivery that did not know about the first create
    assert again.submission_id == first.submission_id
    assert len(livy.batches) == 1


def test_find_pages_to_the_newest_batches(livy: FakeLivy) -> None:
    b = backend(livy)
    for n in range(130):
        b.submit(SparkJobRequest("other", n, f"other-{n}", JOB.job_file, []))
    mine = b.submit(JOB)
    found = b.find(JOB)
    assert found is not None and found.submission_id == mine.submission_id


def test_429_with_retry_after_is_honoured_then_succeeds(livy: FakeLivy) -> None:
    b = backend(livy)
    slept: list[float] = []
    b.http.sleep = slept.append
    livy.throttle = [1, 2]
    assert b.submit(JOB).submission_id == "0"
    assert slept == [1.0, 2.0]
    assert livy.count("POST", "/batches") == 3


def test_429_with_a_long_retry_after_is_transient(livy: FakeLivy) -> None:
    b = backend(livy)
    livy.throttle = [120]
    with pytest.raises(DownstreamUnavailable, match="429"):
        b.submit(JOB)


def test_5xx_and_unreachable_are_transient_and_401_is_permanent(livy: FakeLivy) -> None:
    b = backend(livy)
    livy.canned = [Reply(503, text="Service Unavailable")]
    with pytest.raises(DownstreamUnavailable, match="HTTP 503"):
        b.status("0")
    livy.stop()
    with pytest.raises(DownstreamUnavailable, match="cannot reach"):
        b.status("0")
    fresh = FakeLivy(token="another")
    try:
        with pytest.raises(PermanentError, match="credentials rejected"):
            backend(fresh).submit(JOB)
    finally:
        fresh.stop()


def test_bad_request_is_permanent_with_the_servers_reason(livy: FakeLivy) -> None:
    b = backend(livy)
    bad = SparkJobRequest("job-2", 1, "x", "", [])
    with pytest.raises(PermanentError, match="Missing 'file'"):
        b.submit(bad)


def test_hdinsight_basic_auth_with_x_requested_by() -> None:
    server = FakeLivy(auth="basic", user="admin", password="s3cret-pw")
    try:
        b = backend(server, SPARK_LIVY_AUTH="basic", SPARK_LIVY_USER="admin", SPARK_LIVY_PASSWORD="s3cret-pw")
        sid = b.submit(JOB).submission_id
        assert sid == "0"
        assert b.status(sid).state == "pending"
        b.cancel(sid)
        assert server.batches[0]["state"] == "killed"
    finally:
        server.stop()


def test_basic_auth_without_password_is_a_clear_configuration_error() -> None:
    env = {
        "SPARK_BACKEND": "livy",
        "SPARK_URL": "http://127.0.0.1:9",
        "SPARK_JOB_FILE": "x",
        "SPARK_LIVY_AUTH": "basic",
    }
    with pytest.raises(
        SettingsError, match="SPARK_LIVY_AUTH=basic needs SPARK_LIVY_USER and SPARK_LIVY_PASSWORD"
    ):
        spark_from_env(env)


def test_secrets_never_appear_in_errors(livy: FakeLivy) -> None:
    server = FakeLivy(auth="basic", user="admin", password="right")
    try:
        b = backend(
            server, SPARK_LIVY_AUTH="basic", SPARK_LIVY_USER="admin", SPARK_LIVY_PASSWORD="wrong-s3cret"
        )
        with pytest.raises(PermanentError) as info:
            b.submit(JOB)
        assert "wrong-s3cret" not in str(info.value)
        assert "wrong-s3cret" not in repr(b.http)
    finally:
        server.stop()


def test_the_step_budget_cuts_timeouts_and_refuses_calls_that_cannot_fit(livy: FakeLivy) -> None:
    b = backend(livy, read_timeout_s=30.0)
    livy.canned = [Reply(200, {"sessions": [], "total": 0}, delay_s=3.0)]
    with step_budget(1.5):
        with pytest.raises(ReadTimedOut, match=r"no answer within 1\.\d+s"):  # 30 s cut to what is left
            b.find(JOB)
        seen = len(livy.requests)
        with pytest.raises(BudgetSpent, match="left for the next check"):
            b.status("0")
    assert len(livy.requests) == seen  # the call that could not fit was not made
    assert remaining_budget() is None


@pytest.mark.parametrize("cls", [LivyBackend, DatabricksBackend, StandaloneBackend])
def test_a_backend_built_from_another_backends_settings_names_the_mismatch(
    livy: FakeLivy, cls: type[LivyBackend | DatabricksBackend | StandaloneBackend]
) -> None:
    settings = spark_from_env({
        "SPARK_BACKEND": "livy", "SPARK_URL": livy.url, "SPARK_JOB_FILE": JOB.job_file, "SPARK_LIVY_AUTH": "entra",
    })  # fmt: skip
    if cls is LivyBackend:
        assert cls(settings).http.read_timeout_s == settings.read_timeout_s
        return
    with pytest.raises(
        PermanentError, match=f"{cls.name}: settings were not read for SPARK_BACKEND={cls.name}"
    ):
        cls(settings)
