"""Fabric backend against a local server that answers as Fabric's Livy API on a lakehouse is documented."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError
from azure.identity import CertificateCredential, ClientSecretCredential, ManagedIdentityCredential

from shared.core.errors import DownstreamUnavailable, PermanentError, SettingsError
from shared.spark.backends import BACKENDS, spark_from_env
from shared.spark.fabric import (
    FABRIC_API,
    FABRIC_SCOPE,
    FabricBackend,
    FabricOptions,
    batches_in,
    credential_for,
    pick_newest,
)
from shared.spark.model import SparkJobRequest
from shared.spark.states import fabric_status
from tests.spark.fake_fabric import BATCHES, LAKEHOUSE, TOKEN, WORKSPACE, FakeFabric, batch_id
from tests.spark.fakes import Reply

JOB = SparkJobRequest(
    job_id="job-1",
    submission=1,
    name="aggregate-job-1-s1",
    job_file="abfss://ws@onelake.dfs.fabric.microsoft.com/lh/Files/aggregate_job.py",
    args=["job-1", "e30", "results", "--submission", "1"],
    py_files=["abfss://ws@onelake.dfs.fabric.microsoft.com/lh/Files/engine.zip"],
)
SECRET = "sp-s3cret-value~0123456789"


def env(url: str, **extra: str) -> dict[str, str]:
    return {
        "SPARK_BACKEND": "fabric", "SPARK_URL": url, "SPARK_JOB_FILE": JOB.job_file,
        "SPARK_FABRIC_WORKSPACE_ID": WORKSPACE, "SPARK_FABRIC_LAKEHOUSE_ID": LAKEHOUSE, **extra,
    }  # fmt: skip


@pytest.fixture
def fabric() -> Iterator[FakeFabric]:
    server = FakeFabric()
    yield server
    server.stop()


class Tokens:
    """A token provider that records the scopes asked for; the token is valid only for Fabric's."""

    def __init__(self) -> None:
        self.scopes: list[str] = []

    def __call__(self, scope: str) -> str:
        self.scopes.append(scope)
        return TOKEN if scope == FABRIC_SCOPE else "token-for-another-audience"


def backend(
    server: FakeFabric, read_timeout_s: float = 2.0, tokens: Any = None, **extra: str
) -> FabricBackend:
    settings = spark_from_env(
        env(server.url + "/v1", SPARK_CONNECT_TIMEOUT_SECONDS="1",
            SPARK_READ_TIMEOUT_SECONDS=str(read_timeout_s), SPARK_DOWNSTREAM_TIMEOUT_SECONDS="0.1", **extra)
    )  # fmt: skip
    b = FabricBackend(settings, token_provider=tokens or Tokens())
    b.http.sleep = lambda s: None
    return b


# --- submit, states, cancel ------------------------------------------------------------------------


def test_submit_posts_the_batch_to_the_lakehouse_livy_endpoint_with_a_fabric_token(
    fabric: FakeFabric,
) -> None:
    tokens = Tokens()
    sub = backend(fabric, tokens=tokens).submit(JOB)
    assert sub.submission_id == batch_id(0) and sub.confirmed and sub.backend == "fabric"
    create = fabric.requests[-1]
    assert (create.method, create.path) == ("POST", BATCHES)
    assert create.headers["Authorization"] == f"Bearer {TOKEN}"
    assert tokens.scopes and set(tokens.scopes) == {"https://api.fabric.microsoft.com/.default"}
    body = create.body
    assert body["name"] == JOB.name and body["file"] == JOB.job_file and body["args"] == list(JOB.args)
    assert body["tags"] == {"job_id": "job-1", "submission": "1"} and body["pyFiles"] == list(JOB.py_files)
    assert "spark.fabric.environmentDetails" not in body["conf"]


def test_an_environment_and_sizes_go_in_the_batch(fabric: FakeFabric) -> None:
    env_id = "0a0b0c0d-0000-4000-8000-000000000001"
    b = backend(
        fabric, SPARK_FABRIC_ENVIRONMENT_ID=env_id, SPARK_EXECUTOR_MEMORY="28g", SPARK_NUM_EXECUTORS="4"
    )
    b.submit(JOB)
    body = fabric.requests[-1].body
    assert body["conf"]["spark.fabric.environmentDetails"] == '{"id": "' + env_id + '"}'
    assert body["executorMemory"] == "28g" and body["numExecutors"] == 4


@pytest.mark.parametrize(
    ("state", "result", "expected"),
    [("not_started", "Uncertain", "pending"), ("submitting", "Uncertain", "pending"),
     ("not_submitted", "Uncertain", "pending"), ("starting", "Uncertain", "pending"),
     ("running", "Uncertain", "running"), ("shutting_down", "Uncertain", "running"),
     ("success", "Succeeded", "succeeded"), ("success", "Failed", "failed"),
     ("running", "Cancelled", "failed"), ("dead", "Failed", "failed"), ("killed", "Cancelled", "failed"),
     ("error", "Failed", "failed")],
)  # fmt: skip
def test_states(fabric: FakeFabric, state: str, result: str, expected: str) -> None:
    b = backend(fabric)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    fabric.set_state(sid, state, result)
    assert b.status(sid).state == expected


def test_the_state_mapping_reads_livy_info_when_state_is_absent() -> None:
    assert fabric_status({"livyInfo": {"livyState": "running", "result": "Uncertain"}}).state == "running"
    failed = fabric_status({"livyInfo": {"livyState": "dead", "result": "Failed"}})
    assert (failed.state, failed.message) == ("failed", "Fabric batch ended in state dead (Failed)")
    assert fabric_status({"state": "some_new_state"}).state == "pending"  # unknown: keep checking


def test_a_failed_batch_carries_fabrics_error_and_the_driver_error(fabric: FakeFabric) -> None:
    b = backend(fabric)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    log = ["stdout: ", "Traceback (most recent call last):", "InputDataError: column 'v' is bad"]
    fabric.set_state(sid, "dead", "Failed", error="Spark job failed with exit code 1", log=log)
    status = b.status(sid)
    assert status.state == "failed" and status.raw_state == "dead"
    assert "[SparkJobFailed] Spark job failed with exit code 1" in status.message
    assert "InputDataError: column 'v' is bad" in status.message and "(Failed)" in status.message


def test_a_forgotten_batch_is_unknown(fabric: FakeFabric) -> None:
    b = backend(fabric)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    fabric.forgotten.add(sid)
    status = b.status(sid)
    assert status.state == "unknown" and "no longer knows" in status.message


def test_cancel_deletes_the_batch_and_an_unknown_id_is_ignored(fabric: FakeFabric) -> None:
    b = backend(fabric)
    sid = b.submit(JOB).submission_id
    assert sid is not None
    b.cancel(sid)
    assert fabric.count("DELETE", f"{BATCHES}/{sid}") == 1 and b.status(sid).state == "failed"
    b.cancel(batch_id(99))  # 404: nothing to cancel, no error


# --- duplicate protection: look up by name, never create twice -----------------------------------


def test_read_timeout_on_create_looks_up_by_name_and_never_creates_twice(fabric: FakeFabric) -> None:
    fabric.create_delay_s = 1.5  # the batch is created, the answer comes too late
    sub = backend(fabric, read_timeout_s=0.5).submit(JOB)
    assert sub.submission_id == batch_id(0)
    assert fabric.count("POST", BATCHES) == 1 and fabric.count("GET", BATCHES) >= 1


def test_unfound_after_a_timeout_is_unconfirmed_not_retried(fabric: FakeFabric) -> None:
    fabric.create_delay_s = 1.5
    fabric.forgotten.add(batch_id(0))  # the look-up will not see the created batch
    sub = backend(fabric, read_timeout_s=0.5).submit(JOB)
    assert sub.submission_id is None and not sub.confirmed
    assert fabric.count("POST", BATCHES) == 1


def test_a_duplicate_name_answer_adopts_the_existing_batch(fabric: FakeFabric) -> None:
    fabric.reject_duplicate_names = True
    b = backend(fabric)
    first = b.submit(JOB)
    again = b.submit(JOB)  # e.g. a redelivery that did not know about the first create
    assert again.submission_id == first.submission_id and len(fabric.batches) == 1


def test_find_pages_to_the_newest_batches(fabric: FakeFabric) -> None:
    b = backend(fabric)
    for n in range(130):
        b.submit(SparkJobRequest("other", n, f"other-{n}", JOB.job_file, []))
    mine = b.submit(JOB)
    found = b.find(JOB)
    assert found is not None and found.submission_id == mine.submission_id
    assert b.find(SparkJobRequest("job-9", 1, "aggregate-job-9-s1", JOB.job_file, [])) is None


def test_list_answers_in_every_known_shape_are_read_alike() -> None:
    one = {"id": "a", "name": "n"}
    assert batches_in({"from": 0, "total": 250, "sessions": [one]}) == ([one], 250)
    assert batches_in([one, {"name": "no id"}]) == ([one], 1)
    assert batches_in({"value": [one], "continuationToken": None}) == ([one], 1)
    assert batches_in({"items": []}) == ([], 0)
    with pytest.raises(DownstreamUnavailable, match="no sessions, items or value"):
        batches_in({"error": "x"})


def test_the_newest_match_is_the_last_submitted() -> None:
    old = {"id": "b", "livyInfo": {"submittedAt": "2026-01-01T00:00:05Z"}}
    new = {"id": "a", "submittedAt": "2026-01-01T00:01:00Z"}
    assert pick_newest([new, old]) is new
    assert pick_newest([{"id": "x"}, {"id": "y"}]) == {"id": "y"}  # no times: the list's order
    assert pick_newest([]) is None


# --- outages, throttling, refusals ---------------------------------------------------------------


def test_429_with_retry_after_is_honoured_then_succeeds(fabric: FakeFabric) -> None:
    b = backend(fabric)
    slept: list[float] = []
    b.http.sleep = slept.append
    fabric.throttle = [1, 2]
    assert b.submit(JOB).submission_id == batch_id(0)
    assert slept == [1.0, 2.0] and fabric.count("POST", BATCHES) == 3


def test_429_with_a_long_retry_after_is_transient(fabric: FakeFabric) -> None:
    fabric.throttle = [120]
    with pytest.raises(DownstreamUnavailable, match="429"):
        backend(fabric).submit(JOB)
    assert fabric.batches == {}


def test_a_full_capacity_430_is_transient_everywhere(fabric: FakeFabric) -> None:
    b = backend(fabric)
    fabric.capacity_full = 1
    with pytest.raises(DownstreamUnavailable, match=r"capacity full \(HTTP 430\)"):
        b.submit(JOB)
    assert fabric.batches == {}
    sid = b.submit(JOB).submission_id
    assert sid is not None
    fabric.capacity_full = 3
    for call in (lambda: b.status(sid), lambda: b.find(JOB), lambda: b.cancel(sid)):
        with pytest.raises(DownstreamUnavailable, match="430"):
            call()


def test_5xx_and_unreachable_are_transient_and_a_wrong_token_is_permanent(fabric: FakeFabric) -> None:
    b = backend(fabric)
    fabric.canned = [Reply(503, text="Service Unavailable")]
    with pytest.raises(DownstreamUnavailable, match="HTTP 503"):
        b.status(batch_id(0))
    wrong = backend(fabric, tokens=lambda scope: "an-expired-token")
    with pytest.raises(PermanentError, match="credentials rejected"):
        wrong.submit(JOB)
    fabric.stop()
    with pytest.raises(DownstreamUnavailable, match="cannot reach"):
        b.status(batch_id(0))


def test_a_bad_request_is_permanent_with_fabrics_reason(fabric: FakeFabric) -> None:
    with pytest.raises(PermanentError, match="'file' is required"):
        backend(fabric).submit(SparkJobRequest("job-2", 1, "x", "", []))


def test_the_token_never_reaches_errors_or_logs(fabric: FakeFabric, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    b = backend(fabric)
    sid = b.submit(JOB).submission_id
    assert sid is not None and b.status(sid).state == "pending"
    fabric.canned = [Reply(401, text=f"rejected header Authorization: Bearer {TOKEN}")]
    with pytest.raises(PermanentError) as info:
        b.status(sid)
    assert "rejected header" in str(info.value)  # the server's reason is kept, scrubbed
    assert TOKEN not in str(info.value) and TOKEN not in caplog.text and TOKEN not in repr(b.http)


@pytest.mark.parametrize(
    ("error", "kind", "fragment"),
    [(ClientAuthenticationError(message=f"AADSTS7000215: Invalid client secret provided. secret={SECRET}"),
      PermanentError, "no Entra token for SPARK_FABRIC_AUTH=managed-identity (ClientAuthenticationError)"),
     (ServiceRequestError(message="Connection refused"), DownstreamUnavailable, "cannot get an Entra token now")],
)  # fmt: skip
def test_token_failures_are_classified_and_scrubbed(
    fabric: FakeFabric, error: Exception, kind: type[Exception], fragment: str
) -> None:
    def failing(scope: str) -> str:
        raise error

    with pytest.raises(kind) as info:
        backend(fabric, tokens=failing).submit(JOB)
    assert fragment in str(info.value) and SECRET not in str(info.value)
    assert fabric.requests == []  # nothing was sent without a token


def test_a_busy_token_service_is_transient(fabric: FakeFabric) -> None:
    busy = ClientAuthenticationError(message="the token service answered 503")
    busy.status_code = 503

    def failing(scope: str) -> str:
        raise busy

    with pytest.raises(DownstreamUnavailable, match="cannot get an Entra token now"):
        backend(fabric, tokens=failing).status(batch_id(0))


# --- settings checked at start-up, credentials built from them -----------------------------------


def test_the_fabric_backend_is_in_the_table_with_its_defaults() -> None:
    assert "fabric" in BACKENDS and BACKENDS["fabric"].duplicate_check == "batches listed and matched by name"
    settings = spark_from_env({k: v for k, v in env("").items() if k != "SPARK_URL"})
    assert settings.url == FABRIC_API == "https://api.fabric.microsoft.com/v1"
    opts = settings.options
    assert isinstance(opts, FabricOptions) and opts.auth == "managed-identity" and opts.scope == FABRIC_SCOPE
    b = FabricBackend(settings, token_provider=Tokens())
    assert b.batches == (
        f"https://api.fabric.microsoft.com/v1/workspaces/{WORKSPACE}/lakehouses/{LAKEHOUSE}"
        "/livyApi/versions/2023-12-01/batches"
    )


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [({"SPARK_FABRIC_WORKSPACE_ID": ""}, "SPARK_FABRIC_WORKSPACE_ID is required when SPARK_BACKEND=fabric"),
     ({"SPARK_FABRIC_LAKEHOUSE_ID": "my-lakehouse"}, "SPARK_FABRIC_LAKEHOUSE_ID='my-lakehouse' is not a GUID"),
     ({"SPARK_FABRIC_ENVIRONMENT_ID": "env"}, "SPARK_FABRIC_ENVIRONMENT_ID='env' is not a GUID"),
     ({"SPARK_URL": f"{FABRIC_API}/workspaces/{WORKSPACE}/lakehouses/{LAKEHOUSE}/livyapi/versions/2023-12-01/batches"},
      "SPARK_URL is the Fabric API base"),
     ({"SPARK_FABRIC_AUTH": "password"}, "SPARK_FABRIC_AUTH='password' is not one of managed-identity, service-principal, default"),
     ({"SPARK_FABRIC_AUTH": "service-principal", "SPARK_FABRIC_CLIENT_SECRET": SECRET},
      "SPARK_FABRIC_AUTH=service-principal needs SPARK_FABRIC_TENANT_ID and SPARK_FABRIC_CLIENT_ID"),
     ({"SPARK_FABRIC_AUTH": "service-principal", "SPARK_FABRIC_TENANT_ID": "t", "SPARK_FABRIC_CLIENT_ID": "c"},
      "needs one of SPARK_FABRIC_CLIENT_SECRET or SPARK_FABRIC_CERTIFICATE_PATH"),
     ({"SPARK_FABRIC_AUTH": "service-principal", "SPARK_FABRIC_TENANT_ID": "t", "SPARK_FABRIC_CLIENT_ID": "c",
       "SPARK_FABRIC_CLIENT_SECRET": SECRET, "SPARK_FABRIC_CERTIFICATE_PATH": "/certs/sp.pem"},
      "needs one of SPARK_FABRIC_CLIENT_SECRET or SPARK_FABRIC_CERTIFICATE_PATH"),
     ({"SPARK_FABRIC_LIVY_API_VERSION": "latest"}, "SPARK_FABRIC_LIVY_API_VERSION='latest' is not a date"),
     ({"SPARK_DOWNSTREAM_TIMEOUT_SECONDS": "40", "SPARK_READ_TIMEOUT_SECONDS": "30"},
      "SPARK_DOWNSTREAM_TIMEOUT_SECONDS (40) must be less than SPARK_READ_TIMEOUT_SECONDS (30)")],
)  # fmt: skip
def test_bad_settings_are_refused_at_start_up_naming_the_setting(
    extra: dict[str, str], fragment: str
) -> None:
    with pytest.raises(SettingsError) as info:
        spark_from_env({**env(FABRIC_API), **extra})
    assert fragment in str(info.value)
    assert SECRET not in str(info.value)


def test_a_managed_identity_credential_by_default_user_assigned_from_azure_client_id() -> None:
    system = spark_from_env(env(FABRIC_API)).options
    assert isinstance(system, FabricOptions)
    assert isinstance(credential_for(system), ManagedIdentityCredential) and system.client_id == ""
    user = spark_from_env({**env(FABRIC_API), "AZURE_CLIENT_ID": "uami-client"}).options
    assert isinstance(user, FabricOptions) and user.client_id == "uami-client"
    own = spark_from_env(
        {**env(FABRIC_API), "AZURE_CLIENT_ID": "uami-client", "SPARK_FABRIC_CLIENT_ID": "fabric-uami"}
    ).options
    assert isinstance(own, FabricOptions) and own.client_id == "fabric-uami"
    assert isinstance(credential_for(own), ManagedIdentityCredential)


def test_a_service_principal_credential_with_a_secret_or_a_certificate(tmp_path: Any) -> None:
    sp = {"SPARK_FABRIC_AUTH": "service-principal", "SPARK_FABRIC_TENANT_ID": "contoso.onmicrosoft.com",
          "SPARK_FABRIC_CLIENT_ID": "00000000-0000-4000-8000-0000000000aa"}  # fmt: skip
    settings = spark_from_env({**env(FABRIC_API), **sp, "SPARK_FABRIC_CLIENT_SECRET": SECRET})
    opts = settings.options
    assert isinstance(opts, FabricOptions) and opts.client_secret == SECRET
    assert isinstance(credential_for(opts), ClientSecretCredential)
    assert SECRET not in repr(settings) and SECRET not in repr(opts)
    pem = tmp_path / "sp.pem"
    pem.write_bytes(_self_signed_pem())
    cert = spark_from_env({**env(FABRIC_API), **sp, "SPARK_FABRIC_CERTIFICATE_PATH": str(pem)}).options
    assert isinstance(cert, FabricOptions)
    assert isinstance(credential_for(cert), CertificateCredential)


def _self_signed_pem() -> bytes:
    """A private key and its self-signed certificate, as CertificateCredential reads them."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fabric-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return private + cert.public_bytes(serialization.Encoding.PEM)
