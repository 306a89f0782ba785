"""What the template's tests share: the template, its parameter sets, and what one deployment of
them creates (tests/deploy/armeval.py evaluates it)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from azure.functions.decorators.queue import QueueTrigger

sys.path.insert(0, str(Path(__file__).resolve().parent))
from armeval import (
    Deployed,
    expand,
)

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_PATH = ROOT / "infra" / "main.json"
BICEP_PATH = ROOT / "infra" / "main.bicep"
SCHEMA_PATH = Path(__file__).resolve().parent / "arm_template.schema.json"

ROLE = {
    "blob_owner": "b7e6dc6d-f1e8-4753-8033-0f276bb0955b",
    "blob_contributor": "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    "blob_reader": "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1",
    "queue_contributor": "974c5e8b-45b9-4653-ba55-5f855dd0fb88",
    "table_contributor": "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3",
    "account_contributor": "17d1049b-9a84-46fb-8f53-869881c3d3ab",
    "metrics_publisher": "3913510d-42f4-4e42-8a64-420c390055eb",
}
APP_CONTAINERS = {"ledger", "results", "payloads", "poison-archive"}
TAGGED_CONTAINERS = {"ledger"}
"""Containers whose blobs the app tags and finds by tag: Storage Blob Data Owner (tags/write,
tags/read and filter/action are in no smaller built-in role)."""
HOST_CONTAINERS = {"azure-webjobs-hosts", "azure-webjobs-secrets", "app-package"}
"""The Functions host's own containers (identity-based AzureWebJobsStorage) and the Flex deployment one."""
CONTAINERS = APP_CONTAINERS | HOST_CONTAINERS | {"inputs", "spark-jobs"}
QUEUE_ENDS = ("", "-poison", "-parked", "-ops")
"""The jobs queue, the host's poison queue, the console's parking queue and its bulk operations' queue."""
ENTRIES_TABLE = "poisonarchiveentries"
"""The poison archive's index (table_prefix("poison-archive") + "entries"); the jobs index's per-day
tables (ledger<YYYYMMDD>) are created by the app."""
REQUIRED_SETTINGS = {
    "AzureWebJobsStorage__accountName",
    "AzureWebJobsStorage__credential",
    "AzureWebJobsStorage__clientId",
    "AzureWebJobsStorage__tableServiceUri",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    "JOBS_QUEUE",
    "LEDGER_CONTAINER",
    "RESULTS_CONTAINER",
    "PAYLOADS_CONTAINER",
    "POISON_ARCHIVE_CONTAINER",
    "INPUT_CONTAINERS",
    "PYTHON_ENABLE_OPENTELEMETRY",
    "MAX_ATTEMPTS",
    "SPARK_BACKEND",
    "SPARK_URL",
    "SPARK_LIVY_AUTH",
    "SPARK_JOB_FILE",
    "SPARK_OFFLOAD_THRESHOLD_BYTES",
    "SPARK_DATABRICKS_CLUSTER_ID",
}
# Settings Flex Consumption rejects (the runtime comes from functionAppConfig; no content share),
# and the key-based storage connection.
FORBIDDEN_SETTINGS = {
    "FUNCTIONS_WORKER_RUNTIME",
    "FUNCTIONS_EXTENSION_VERSION",
    "WEBSITE_RUN_FROM_PACKAGE",
    "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
    "WEBSITE_CONTENTSHARE",
    "WEBSITE_NODE_DEFAULT_VERSION",
    "SCM_DO_BUILD_DURING_DEPLOYMENT",
    "ENABLE_ORYX_BUILD",
    "AzureWebJobsStorage",
    "APPINSIGHTS_INSTRUMENTATIONKEY",
}
# Settings read by the platform / SDKs rather than by shared/config/settings.py.
PLATFORM_SETTINGS = {
    "AzureWebJobsStorage__credential",
    "AZURE_CLIENT_ID",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    "PYTHON_THREADPOOL_THREAD_COUNT",  # the Python worker's thread pool for sync functions
}

PARAM_SETS: dict[str, dict[str, Any]] = {
    "defaults": {"namePrefix": "jobs"},
    "livy": {
        "namePrefix": "qj",
        "consoleClientId": "0a1b2c3d-0000-4000-8000-00000000c0de",
        "consoleAllowedGroups": "11111111-aaaa-bbbb-cccc-222222222222",
        "sparkBackend": "livy",
        "sparkUrl": "https://myws.dev.azuresynapse.net/livyApi/versions/2019-11-01-preview/sparkPools/pool1",
        "sparkPrincipalId": "11111111-2222-3333-4444-555555555555",
        "deployerPrincipalId": "66666666-7777-8888-9999-000000000000",
        "extraAppSettings": {"SPARK_READ_TIMEOUT_SECONDS": "45", "SPARK_BACKEND": "databricks"},
    },
    "hdinsight": {
        "namePrefix": "hdi",
        "sparkBackend": "livy",
        "sparkUrl": "https://mycluster.azurehdinsight.net/livy",
        "sparkLivyAuth": "basic",
        "sparkLivyUser": "admin",
        "sparkLivyPasswordSecretUri": "https://kv-jobs.vault.azure.net/secrets/livy-password",
        "sparkJobFile": "abfss://jobs@hdistore.dfs.core.windows.net/aggregate_job.py",
        "sparkPyFiles": "abfss://jobs@hdistore.dfs.core.windows.net/aggregate_engine.zip",
    },
    "databricks": {
        "namePrefix": "jobs9prod",
        "sparkBackend": "databricks",
        "sparkUrl": "https://adb-123.4.azuredatabricks.net",
        "sparkDatabricksClusterId": "0101-123456-abcdefgh",
        "sparkDatabricksTokenSecretUri": "https://kv-jobs.vault.azure.net/secrets/databricks-pat",
        "grantStorageAccountContributor": True,
        "maxAttempts": 7,
        "instanceMemoryMB": 4096,
        "httpAllowedHosts": "partner.internal,10.1.2.3",
        "httpFollowRedirects": True,
        "httpMaxAttempts": 3,
        "httpRetryJitter": False,
    },
    "standalone": {
        "namePrefix": "ab",
        "sparkBackend": "standalone",
        "sparkUrl": "http://spark-master.internal:6066",
        "sparkJobFile": "/opt/jobs/aggregate_job.py",
        "jobsQueueName": "work",
        "extraJobsQueueNames": ["gold", "silver-eu"],
        "extraAppSettings": {"SPARK_MASTER_UI_URL": "http://spark-master.internal:8080"},
    },
}


def deployment(template: dict[str, Any], case: str) -> tuple[list[Deployed], dict[str, Any]]:
    # `armeval` is imported from this folder by path, so mypy sees it as untyped here
    result: tuple[list[Deployed], dict[str, Any]] = expand(template, PARAM_SETS[case])
    return result


def one(resources: list[Deployed], type_: str) -> Deployed:
    found = [r for r in resources if r.type == type_]
    assert len(found) == 1, f"expected one {type_}, got {[r.name for r in found]}"
    return found[0]


def app_settings(resources: list[Deployed]) -> dict[str, str]:
    configs = [
        r for r in resources if r.type == "Microsoft.Web/sites/config" and r.name.endswith("/appsettings")
    ]
    assert len(configs) == 1, "one appsettings resource"
    config = configs[0]
    assert config.name == one(resources, "Microsoft.Web/sites").name + "/appsettings"
    settings = config.body["properties"]
    assert all(isinstance(v, str) for v in settings.values()), "app setting values must be strings"
    return dict(settings)


def host_json_file(tmp_path: Path) -> Path:
    """The repository's host.json, or a minimal one in `tmp_path` where it is missing."""
    real = ROOT / "host.json"
    if real.exists():
        return real
    fallback = tmp_path / "host.json"
    fallback.write_text(json.dumps({"version": "2.0", "functionTimeout": "00:10:00"}), encoding="utf-8")
    return fallback


def watched_queues(monkeypatch: pytest.MonkeyPatch, jobs_queue: str = "jobs") -> list[str]:
    """The queues the app's queue-triggered functions watch, from the app's own function index
    (the triggers are built in a loop from the settings: reading the source would miss them)."""
    monkeypatch.setenv("JOBS_QUEUE", jobs_queue)
    monkeypatch.delenv("JOBS_QUEUES", raising=False)
    import function_app

    function_app = importlib.reload(function_app)
    triggers = [f.get_trigger() for f in function_app.app.get_functions()]
    return sorted(
        t.queue_name.replace("%JOBS_QUEUE%", jobs_queue) for t in triggers if isinstance(t, QueueTrigger)
    )
