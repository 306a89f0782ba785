"""Settings: typed, validated, errors name the setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.config.settings import Settings, parse_timespan
from shared.core.errors import SettingsError

CONN = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:1/x;"


def test_defaults_with_a_connection_string() -> None:
    s = Settings.from_env({"AzureWebJobsStorage": CONN})
    assert s.jobs_queue == "jobs" and s.poison_queue == "jobs-poison"
    assert s.function_timeout_s == 600 and s.max_dequeue_count == 5
    assert s.max_takeovers == 5
    assert s.claim_lease_s == 30 and s.heartbeat_s == 10
    assert not s.storage.identity_based
    assert "a2V5" not in s.storage.describe()


def test_identity_based_account_name() -> None:
    s = Settings.from_env(
        {"AzureWebJobsStorage__accountName": "acct", "AzureWebJobsStorage__clientId": "cid"}
    )
    assert s.storage.identity_based
    assert s.storage.blob_service_uri == "https://acct.blob.core.windows.net"
    assert s.storage.queue_service_uri == "https://acct.queue.core.windows.net"
    assert s.storage.client_id == "cid"


def test_identity_based_service_uris() -> None:
    s = Settings.from_env(
        {
            "AzureWebJobsStorage__blobServiceUri": "https://a.blob.core.windows.net",
            "AzureWebJobsStorage__queueServiceUri": "https://a.queue.core.windows.net",
        }
    )
    assert s.storage.identity_based and s.storage.account_name is None


def test_missing_storage_is_named() -> None:
    with pytest.raises(SettingsError, match="AzureWebJobsStorage is not set"):
        Settings.from_env({})


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"MAX_ATTEMPTS": "many"}, "MAX_ATTEMPTS='many' is not an integer"),
        ({"MAX_ATTEMPTS": "0"}, "MAX_ATTEMPTS=0 must be >= 1"),
        ({"MAX_TAKEOVERS": "0"}, "MAX_TAKEOVERS=0 must be >= 1"),
        ({"MAX_TAKEOVERS": "few"}, "MAX_TAKEOVERS='few' is not an integer"),
        ({"JOBS_QUEUE": "Bad_Name"}, "JOBS_QUEUE='Bad_Name' is not a valid"),
        ({"JOBS_QUEUE": "q" * 57}, "JOBS_QUEUE="),
        ({"SPARK_BACKEND": "yarn"}, "SPARK_BACKEND='yarn' is not one of"),
        ({"RETRY_BASE_SECONDS": "x"}, "RETRY_BASE_SECONDS='x' is not a number"),
        ({"AzureWebJobsStorage": "nonsense"}, "AzureWebJobsStorage is not a storage connection string"),
    ],
)
def test_bad_values_name_the_setting(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"AzureWebJobsStorage": CONN, **env})
    assert fragment in str(info.value)
    assert "a2V5" not in str(info.value)


def test_spark_timeouts_must_nest(tmp_path: Path) -> None:
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"functionTimeout": "00:00:30"}))
    base = {
        "AzureWebJobsStorage": CONN,
        "SPARK_BACKEND": "livy",
        "SPARK_URL": "http://x",
        "SPARK_JOB_FILE": "f",
    }
    with pytest.raises(SettingsError) as info:
        Settings.from_env(
            {**base, "SPARK_DOWNSTREAM_TIMEOUT_SECONDS": "40", "SPARK_READ_TIMEOUT_SECONDS": "30"},
            host_json=host,
        )
    text = str(info.value)
    assert "SPARK_DOWNSTREAM_TIMEOUT_SECONDS (40) must be less than SPARK_READ_TIMEOUT_SECONDS (30)" in text
    assert (
        "SPARK_STEP_BUDGET_SECONDS (150) + 60s for storage work must fit in host.json functionTimeout (30s)"
        in text
    )
    ok = Settings.from_env(
        {**base, "SPARK_READ_TIMEOUT_SECONDS": "20"}, host_json=host.with_name("none.json")
    )
    assert ok.spark.backend == "livy" and ok.spark.step_budget_s + 60 <= ok.function_timeout_s


def test_one_spark_call_at_its_worst_must_fit_the_step_budget() -> None:
    env = {
        "AzureWebJobsStorage": CONN, "SPARK_BACKEND": "databricks", "SPARK_URL": "https://adb",
        "SPARK_JOB_FILE": "f", "SPARK_DATABRICKS_CLUSTER_ID": "c", "SPARK_READ_TIMEOUT_SECONDS": "40",
        "SPARK_RETRY_AFTER_MAX_SECONDS": "30",
    }  # fmt: skip
    with pytest.raises(
        SettingsError, match=r"SPARK_STEP_BUDGET_SECONDS \(150\) must hold one Spark call .* = 195s"
    ):
        Settings.from_env({**env, "SPARK_STEP_BUDGET_SECONDS": "150"})
    assert Settings.from_env(env).spark.step_budget_s == 195  # unset: sized for one call at its worst
    assert Settings.from_env({**env, "SPARK_STEP_BUDGET_SECONDS": "200"}).spark.step_budget_s == 200


def test_standalone_without_a_way_to_find_its_drivers_is_refused() -> None:
    env = {
        "AzureWebJobsStorage": CONN,
        "SPARK_BACKEND": "standalone",
        "SPARK_URL": "http://m:6066",
        "SPARK_JOB_FILE": "f",
    }
    with pytest.raises(SettingsError, match="SPARK_MASTER_UI_URL is required when SPARK_BACKEND=standalone"):
        Settings.from_env(env)
    ok = Settings.from_env({**env, "SPARK_MASTER_UI_URL": "http://m:8080/"})
    assert ok.spark.options is not None and ok.spark.max_concurrent_runs == 1


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"SPARK_BACKEND": "yarn"}, "SPARK_BACKEND='yarn' is not one of none, standalone, livy, databricks"),
        ({"SPARK_CORES_MAX": "two"}, "SPARK_CORES_MAX='two' is not an integer"),
        ({"SPARK_MASTER_UI_URL": "m:8080"}, "SPARK_MASTER_UI_URL='m:8080' is not an http(s) URL"),
        (
            {"SPARK_RUN_TIMEOUT_SECONDS": "200"},
            "SPARK_RUN_TIMEOUT_SECONDS (200) must be longer than SPARK_POLL_MAX_SECONDS (300)",
        ),
        ({"SPARK_STORAGE_ACCESS": "nfs"}, "SPARK_STORAGE_ACCESS='nfs' is not one of"),
        ({"SPARK_MAX_CONCURRENT_RUNS": "-1"}, "SPARK_MAX_CONCURRENT_RUNS=-1 must be >= 0"),
        (
            {"SPARK_BACKEND": "livy", "SPARK_LIVY_AUTH": "basic", "SPARK_LIVY_PASSWORD": "pw-s3cret"},
            "SPARK_LIVY_AUTH=basic needs SPARK_LIVY_USER and SPARK_LIVY_PASSWORD",
        ),
        (
            {"SPARK_BACKEND": "databricks", "SPARK_DATABRICKS_NEW_CLUSTER": "{nope"},
            "SPARK_DATABRICKS_NEW_CLUSTER is not valid JSON",
        ),
        (
            {
                "SPARK_BACKEND": "databricks",
                "SPARK_DATABRICKS_CLUSTER_ID": "c",
                "SPARK_DATABRICKS_AUTH": "pat",
            },
            "SPARK_DATABRICKS_AUTH='pat' is not one of entra, token",
        ),
    ],
)
def test_backend_settings_are_checked_at_start_up(extra: dict[str, str], fragment: str) -> None:
    env = {
        "AzureWebJobsStorage": CONN, "SPARK_BACKEND": "standalone", "SPARK_URL": "http://m:6066",
        "SPARK_MASTER_UI_URL": "http://m:8080", "SPARK_JOB_FILE": "f", **extra,
    }  # fmt: skip
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    assert fragment in str(info.value)
    assert "pw-s3cret" not in str(info.value)


def test_spark_requires_url_and_job_file() -> None:
    with pytest.raises(SettingsError, match="SPARK_URL is required"):
        Settings.from_env({"AzureWebJobsStorage": CONN, "SPARK_BACKEND": "livy"})


@pytest.mark.parametrize(("text", "seconds"), [("00:05:00", 300), ("1.00:00:01", 86401), ("00:00:02.5", 2.5)])
def test_timespan(text: str, seconds: float) -> None:
    assert parse_timespan(text) == seconds


def test_bad_timespan() -> None:
    with pytest.raises(ValueError):
        parse_timespan("5 minutes")


# ------------------------------------------------------------------ identity-based AzureWebJobsStorage

ACCOUNT_URIS = {
    "AzureWebJobsStorage__blobServiceUri": "https://acct.blob.core.windows.net",
    "AzureWebJobsStorage__queueServiceUri": "https://acct.queue.core.windows.net",
}


def _problems(env: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    return str(info.value)


def test_managed_identity_with_client_id_as_the_template_sets_it() -> None:
    s = Settings.from_env(
        {
            "AzureWebJobsStorage__accountName": "acct",
            "AzureWebJobsStorage__credential": "managedidentity",
            "AzureWebJobsStorage__clientId": "cid",
            "AZURE_CLIENT_ID": "other",
        }
    ).storage
    assert (s.credential, s.client_id, s.managed_identity_resource_id) == ("managedidentity", "cid", None)
    assert "user-assigned managed identity (client id cid)" in s.describe()


def test_credential_value_is_case_insensitive() -> None:
    s = Settings.from_env({**ACCOUNT_URIS, "AzureWebJobsStorage__credential": "ManagedIdentity"}).storage
    assert s.credential == "managedidentity"


def test_managed_identity_defaults_to_azure_client_id_then_system_assigned() -> None:
    base = {**ACCOUNT_URIS, "AzureWebJobsStorage__credential": "managedidentity"}
    assert Settings.from_env({**base, "AZURE_CLIENT_ID": "env-cid"}).storage.client_id == "env-cid"
    system = Settings.from_env(base).storage
    assert system.client_id is None and system.describe_identity() == "system-assigned managed identity"


def test_managed_identity_by_resource_id() -> None:
    rid = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/id"
    s = Settings.from_env(
        {
            **ACCOUNT_URIS,
            "AzureWebJobsStorage__credential": "managedidentity",
            "AzureWebJobsStorage__managedIdentityResourceId": rid,
            "AZURE_CLIENT_ID": "not-used-with-a-resource-id",
        }
    ).storage
    assert s.managed_identity_resource_id == rid and s.client_id is None


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        (
            {
                "AzureWebJobsStorage__credential": "managedidentity",
                "AzureWebJobsStorage__clientId": "a",
                "AzureWebJobsStorage__managedIdentityResourceId": "/x",
            },
            "both name the managed identity",
        ),
        (
            {
                "AzureWebJobsStorage__credential": "managedidentity",
                "AzureWebJobsStorage__clientSecret": "s3cr3t",
            },
            "a managed identity has no secret",
        ),
        (
            {"AzureWebJobsStorage__credential": "azurecli"},
            "AzureWebJobsStorage__credential='azurecli' is not supported",
        ),
        (
            {"AzureWebJobsStorage__credential": "managedidentityasfederatedidentity"},
            "managedidentityasfederatedidentity (storage in another tenant) is not supported",
        ),
        ({"AzureWebJobsStorage__clientSecret": "s3cr3t"}, "needs AzureWebJobsStorage__tenantId"),
        (
            {"AzureWebJobsStorage__managedIdentityResourceId": "/x"},
            "read only with AzureWebJobsStorage__credential",
        ),
    ],
)
def test_identity_settings_that_do_not_fit_are_named(env: dict[str, str], fragment: str) -> None:
    text = _problems({**ACCOUNT_URIS, **env})
    assert fragment in text
    assert "s3cr3t" not in text


def test_service_principal_for_local_development() -> None:
    s = Settings.from_env(
        {
            **ACCOUNT_URIS,
            "AzureWebJobsStorage__tenantId": "tid",
            "AzureWebJobsStorage__clientId": "app",
            "AzureWebJobsStorage__clientSecret": "s3cr3t",
        }
    ).storage
    assert (s.credential, s.tenant_id, s.client_id, s.client_secret) == (None, "tid", "app", "s3cr3t")
    assert "s3cr3t" not in repr(s) and "s3cr3t" not in s.describe()
    assert "service principal app in tenant tid" in s.describe()


def test_service_uri_is_the_blob_service_and_needs_a_queue_service() -> None:
    text = _problems({"AzureWebJobsStorage__serviceUri": "https://acct.blob.core.windows.net"})
    assert "AzureWebJobsStorage__serviceUri names a single service" in text
    s = Settings.from_env(
        {
            "AzureWebJobsStorage__serviceUri": "https://custom.blob.example",
            "AzureWebJobsStorage__queueServiceUri": "https://custom.queue.example",
        }
    ).storage
    assert (s.blob_service_uri, s.queue_service_uri) == (
        "https://custom.blob.example",
        "https://custom.queue.example",
    )
    explicit = Settings.from_env(
        {**ACCOUNT_URIS, "AzureWebJobsStorage__serviceUri": "https://ignored.blob.example"}
    ).storage
    assert explicit.blob_service_uri == ACCOUNT_URIS["AzureWebJobsStorage__blobServiceUri"]


def test_connection_string_wins_over_identity_settings() -> None:
    s = Settings.from_env({"AzureWebJobsStorage": CONN, "AzureWebJobsStorage__credential": "bogus"}).storage
    assert s.connection_string == CONN and s.credential is None


# ------------------------------------------------------------------ the credential those settings give


def _credential(env: dict[str, str]) -> object:
    from shared.storage.clients import credential_for

    return credential_for(Settings.from_env({**ACCOUNT_URIS, **env}).storage)


def test_managed_identity_credential_is_the_only_source(monkeypatch: pytest.MonkeyPatch) -> None:
    from azure.identity import ManagedIdentityCredential

    monkeypatch.setenv("AZURE_CLIENT_SECRET", "would-be-used-by-DefaultAzureCredential")
    cred = _credential(
        {"AzureWebJobsStorage__credential": "managedidentity", "AzureWebJobsStorage__clientId": "cid"}
    )
    assert isinstance(cred, ManagedIdentityCredential)
    by_resource = _credential(
        {
            "AzureWebJobsStorage__credential": "managedidentity",
            "AzureWebJobsStorage__managedIdentityResourceId": "/r",
        }
    )
    assert isinstance(by_resource, ManagedIdentityCredential)


def test_local_development_credentials() -> None:
    from azure.identity import ClientSecretCredential, DefaultAzureCredential

    sp = _credential(
        {
            "AzureWebJobsStorage__tenantId": "00000000-0000-0000-0000-000000000001",
            "AzureWebJobsStorage__clientId": "00000000-0000-0000-0000-000000000002",
            "AzureWebJobsStorage__clientSecret": "s3cr3t",
        }
    )
    assert isinstance(sp, ClientSecretCredential)
    developer = _credential({"AzureWebJobsStorage__tenantId": "00000000-0000-0000-0000-000000000001"})
    assert isinstance(developer, DefaultAzureCredential)
    assert isinstance(_credential({}), DefaultAzureCredential)


def test_recovery_interval_default_and_floor() -> None:
    assert Settings.from_env({"AzureWebJobsStorage": CONN}).recovery_interval_s == 30
    with pytest.raises(SettingsError, match="RECOVERY_INTERVAL_SECONDS"):
        Settings.from_env({"AzureWebJobsStorage": CONN, "RECOVERY_INTERVAL_SECONDS": "1"})


# ------------------------------------------------------------------ the table endpoint (console indexes)


@pytest.mark.parametrize(
    ("env", "uri"),
    [
        # as the template sets it: the account's table endpoint, with its trailing slash
        (
            {
                "AzureWebJobsStorage__accountName": "acct",
                "AzureWebJobsStorage__tableServiceUri": "https://acct.table.core.windows.net/",
            },
            "https://acct.table.core.windows.net/",
        ),
        ({"AzureWebJobsStorage__accountName": "acct"}, "https://acct.table.core.windows.net"),
        (
            {**ACCOUNT_URIS, "AzureWebJobsStorage__tableServiceUri": "https://acct.table.example"},
            "https://acct.table.example",
        ),
        (ACCOUNT_URIS, None),  # service uris without a table one: shared/storage/tables.py derives it
    ],
)
def test_identity_based_table_service_uri(env: dict[str, str], uri: str | None) -> None:
    s = Settings.from_env({**env, "AzureWebJobsStorage__credential": "managedidentity"}).storage
    assert s.table_service_uri == uri


def test_table_service_uri_must_be_a_url() -> None:
    text = _problems({**ACCOUNT_URIS, "AzureWebJobsStorage__tableServiceUri": "acct.table.core.windows.net"})
    assert "AzureWebJobsStorage__tableServiceUri must be an http(s) URL" in text


@pytest.mark.parametrize(
    ("env", "url"),
    [
        (
            {
                "AzureWebJobsStorage__accountName": "acct",
                "AzureWebJobsStorage__tableServiceUri": "https://acct.table.core.usgovcloudapi.net/",
            },
            "https://acct.table.core.usgovcloudapi.net",
        ),
        ({"AzureWebJobsStorage__accountName": "acct"}, "https://acct.table.core.windows.net"),
        (ACCOUNT_URIS, "https://acct.table.core.windows.net"),
        ({**ACCOUNT_URIS, "AzureWebJobsStorage__tableServiceUri": "https://t.example/"}, "https://t.example"),
        (
            {
                "AzureWebJobsStorage__blobServiceUri": "https://custom.example",
                "AzureWebJobsStorage__queueServiceUri": "https://custom.example:1",
            },
            None,
        ),
    ],
)
def test_table_endpoint_for_identity_based_settings(env: dict[str, str], url: str | None) -> None:
    """The URL shared/storage/tables.py gives the Table service client (with the identity's token credential)."""
    conn = Settings.from_env({**env, "AzureWebJobsStorage__credential": "managedidentity"}).storage
    assert conn.table_endpoint() == url


def test_table_service_client_uses_the_table_endpoint_and_the_identity() -> None:
    pytest.importorskip("azure.data.tables")
    from shared.storage.tables import NoTableEndpoint, table_service

    conn = Settings.from_env(
        {
            "AzureWebJobsStorage__accountName": "acct",
            "AzureWebJobsStorage__tableServiceUri": "https://acct.table.core.windows.net/",
            "AzureWebJobsStorage__credential": "managedidentity",
            "AzureWebJobsStorage__clientId": "cid",
        }
    ).storage
    client = table_service(conn)  # builds the client only: no request, no token
    assert client.url.rstrip("/") == "https://acct.table.core.windows.net"
    with pytest.raises(NoTableEndpoint):
        table_service(
            Settings.from_env(
                {
                    "AzureWebJobsStorage__blobServiceUri": "https://custom.example",
                    "AzureWebJobsStorage__queueServiceUri": "https://custom.example:1",
                }
            ).storage
        )
