"""How a Spark job reaches the storage account, per backend, without secrets in its arguments.

- `blob-sdk` (default for `standalone`): the job reads byte ranges through the Blob SDK. A local
  cluster gets the connection string in the driver's environment (the REST body's
  `environmentVariables`), never in its arguments; an identity-based account is reached with the
  cluster's own identity (`--blob-endpoint`).
- `hadoop` (default for `livy`/`databricks`): the cluster reads and writes `abfss://` (or
  `wasbs://`) URLs natively with its own identity; the URL shape is SPARK_STORAGE_URL_TEMPLATE.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlparse

from shared.config.settings import Settings
from shared.core.errors import PayloadError
from shared.storage.clients import DEV_CONNECTION

DEFAULT_URL_TEMPLATE = "abfss://{container}@{account}.dfs.core.windows.net/{path}"
CONNECTION_ENV = "AZURE_STORAGE_CONNECTION_STRING"


@dataclass(frozen=True)
class JobStorage:
    args: list[str]
    env: dict[str, str] = field(default_factory=dict, repr=False)


def split_input(value: str) -> tuple[str, str]:
    """'<container>/<blob path>' -> (container, path)."""
    container, _, path = value.partition("/")
    if not container or not path:
        raise PayloadError([f"payload.input: expected '<container>/<blob path>', got {value!r}"])
    return container, path


def account_name(settings: Settings) -> str:
    conn = settings.storage
    if conn.account_name:
        return conn.account_name
    if conn.connection_string:
        match = re.search(r"AccountName=([^;]+)", conn.connection_string)
        if match:
            return match.group(1)
        if conn.connection_string == "UseDevelopmentStorage=true":
            return "devstoreaccount1"
    host = urlparse(conn.blob_service_uri or "").hostname or ""
    return host.split(".")[0]


def job_storage(settings: Settings, input_ref: str) -> JobStorage:
    """Arguments (and, for a local cluster, environment) that let the job read and write."""
    spark = settings.spark
    mode = spark.storage_access or ("blob-sdk" if spark.backend == "standalone" else "hadoop")
    container, path = split_input(input_ref)
    if mode == "hadoop":
        template = spark.storage_url_template or DEFAULT_URL_TEMPLATE
        account = account_name(settings)
        input_url = template.format(container=container, account=account, path=path)
        results_url = template.format(container=settings.results_container, account=account, path="")
        return JobStorage(args=["--input-url", input_url, "--results-url", results_url])
    conn = settings.storage
    if conn.connection_string is not None and spark.backend == "standalone":
        text = (
            DEV_CONNECTION
            if conn.connection_string == "UseDevelopmentStorage=true"
            else conn.connection_string
        )
        return JobStorage(args=[], env={CONNECTION_ENV: text})
    endpoint = conn.blob_service_uri or f"https://{account_name(settings)}.blob.core.windows.net"
    return JobStorage(args=["--blob-endpoint", endpoint])
