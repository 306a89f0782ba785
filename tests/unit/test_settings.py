"""Settings: typed, validated, errors name the setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.errors import SettingsError
from shared.settings import Settings, parse_timespan

CONN = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:1/x;"


def test_defaults_with_a_connection_string() -> None:
    s = Settings.from_env({"AzureWebJobsStorage": CONN})
    assert s.jobs_queue == "jobs" and s.poison_queue == "jobs-poison"
    assert s.function_timeout_s == 600 and s.max_dequeue_count == 5
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
        "SPARK_BACKEND": "standalone",
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
    assert "functionTimeout (30s)" in text
    ok = Settings.from_env(
        {**base, "SPARK_READ_TIMEOUT_SECONDS": "20"}, host_json=host.with_name("none.json")
    )
    assert ok.spark.backend == "standalone"


def test_spark_requires_url_and_job_file() -> None:
    with pytest.raises(SettingsError, match="SPARK_URL is required"):
        Settings.from_env({"AzureWebJobsStorage": CONN, "SPARK_BACKEND": "livy"})


@pytest.mark.parametrize(("text", "seconds"), [("00:05:00", 300), ("1.00:00:01", 86401), ("00:00:02.5", 2.5)])
def test_timespan(text: str, seconds: float) -> None:
    assert parse_timespan(text) == seconds


def test_bad_timespan() -> None:
    with pytest.raises(ValueError):
        parse_timespan("5 minutes")
