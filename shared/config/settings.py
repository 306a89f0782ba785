"""Typed settings read once from app settings (environment variables), validated at start-up.

Every error names the setting so an operator knows what to fix.
"""

from __future__ import annotations

import json
import os
import re
from collections import ChainMap
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from shared.config.retention import RetentionDays, Rule, rules
from shared.config.retention import problems as retention_problems
from shared.core.containers import check_input_containers
from shared.core.errors import SettingsError
from shared.core.setting_reader import NAME_RE, SettingReader
from shared.queues import QueueSet, QueueSettings, read_queues
from shared.spark.backends import read_spark
from shared.spark.config import SparkSettings

__all__ = ["SettingReader", "Settings", "SparkSettings", "StorageConnection", "parse_timespan"]

HOST_JSON = Path(__file__).resolve().parents[2] / "host.json"

DEFAULT_MAX_GROUPS = 50_000
DEFAULT_MAX_TAKEOVERS = 5


@dataclass(frozen=True)
class StorageConnection:
    """How to reach the storage account: the host's `AzureWebJobsStorage` settings, read as the
    Functions documentation names them ("Connecting to host storage with an identity" and "Common
    properties for identity-based connections")."""

    connection_string: str | None = None
    """A full connection string (or UseDevelopmentStorage=true). Mutually exclusive with identity."""
    account_name: str | None = None
    """Identity based: `AzureWebJobsStorage__accountName`."""
    blob_service_uri: str | None = None
    """Identity based: `AzureWebJobsStorage__blobServiceUri` (derived from account name if unset)."""
    queue_service_uri: str | None = None
    """Identity based: `AzureWebJobsStorage__queueServiceUri` (derived from account name if unset)."""
    table_service_uri: str | None = None
    """Identity based: `AzureWebJobsStorage__tableServiceUri` (derived from account name if unset; else
    from the blob service uri by `shared/storage/tables.py`): the console's indexes and the host's diagnostic events."""
    client_id: str | None = None
    """`AzureWebJobsStorage__clientId`. With `credential` managedidentity: the user-assigned
    identity's client id (default `AZURE_CLIENT_ID`; neither: the system-assigned identity). Without
    `credential` (local development): the app registration of a service principal."""
    credential: str | None = None
    """`AzureWebJobsStorage__credential`: "managedidentity", or None for local development (the
    developer's own identity, or a service principal with tenantId, clientId and clientSecret)."""
    managed_identity_resource_id: str | None = None
    """`AzureWebJobsStorage__managedIdentityResourceId`: the user-assigned identity by resource id."""
    tenant_id: str | None = None
    """`AzureWebJobsStorage__tenantId` (local development): the service principal's tenant, also the
    tenant the developer identity signs in to."""
    client_secret: str | None = field(default=None, repr=False)
    """`AzureWebJobsStorage__clientSecret` (local development only; never in Azure)."""

    @property
    def identity_based(self) -> bool:
        return self.connection_string is None

    def table_endpoint(self) -> str | None:
        """Identity based: the Table service URL (`shared/storage/tables.py`): `tableServiceUri`, else the
        account's table endpoint by name, else the blob service uri's with `.table.`; None when
        nothing names it (a custom blob endpoint without a table one)."""
        if self.table_service_uri:
            return self.table_service_uri.rstrip("/")
        if self.account_name:
            return f"https://{self.account_name}.table.core.windows.net"
        if self.blob_service_uri and ".blob." in self.blob_service_uri:
            return self.blob_service_uri.rstrip("/").replace(".blob.", ".table.", 1)
        return None

    def describe_identity(self) -> str:
        """Which identity the connection uses (safe for logs: ids only, never a secret)."""
        if self.credential == "managedidentity":
            if self.managed_identity_resource_id:
                return f"user-assigned managed identity {self.managed_identity_resource_id}"
            if self.client_id:
                return f"user-assigned managed identity (client id {self.client_id})"
            return "system-assigned managed identity"
        if self.client_secret:
            return f"service principal {self.client_id} in tenant {self.tenant_id}"
        return "developer identity (Azure CLI, VS Code, shared token cache, or a managed identity)"

    def describe(self) -> str:
        """A description safe for logs (never the key)."""
        if self.connection_string is not None:
            match = re.search(r"AccountName=([^;]+)", self.connection_string)
            name = match.group(1) if match else "development storage"
            return f"connection string for account {name}"
        return (
            f"identity-based connection to {self.blob_service_uri} / {self.queue_service_uri} "
            f"as {self.describe_identity()}"
        )


@dataclass(frozen=True)
class Settings:
    """All settings of the app. Build with `Settings.from_env()`."""

    storage: StorageConnection
    """`AzureWebJobsStorage` (connection string) or `AzureWebJobsStorage__*` (identity)."""
    jobs_queue: str = "jobs"
    """`JOBS_QUEUE`: the main queue; its poison queue is `<name>-poison`. With `JOBS_QUEUES`, the
    first of them (the default queue)."""
    queues: QueueSet | None = None
    """`JOBS_QUEUES` and each queue's `QUEUE_<NAME>_*` (shared/queues); None: `jobs_queue` alone."""
    ledger_container: str = "ledger"
    """`LEDGER_CONTAINER`: one JSON blob per job id."""
    results_container: str = "results"
    """`RESULTS_CONTAINER`: result documents, `<id>.json`."""
    payloads_container: str = "payloads"
    """`PAYLOADS_CONTAINER`: claim-check payloads too large for a queue message."""
    poison_archive_container: str = "poison-archive"
    """`POISON_ARCHIVE_CONTAINER`: archived poison messages."""
    function_timeout_s: float = 300.0
    """host.json `functionTimeout` (read from the deployed host.json; 300 s, the Consumption
    default, when it is not set there)."""
    max_dequeue_count: int = 5
    """host.json `extensions.queues.maxDequeueCount` (the sweeper archives messages past it)."""
    claim_lease_s: float = 30.0
    """`CLAIM_LEASE_SECONDS`: how long a claim lasts without a heartbeat, so how soon a dead
    owner's job runs again. Kept alive by the owner's heartbeat while the handler runs."""
    heartbeat_s: float = 10.0
    """`CLAIM_HEARTBEAT_SECONDS`: interval of the owner's claim renewal (default: a third of the
    lease, so two renewals may fail before the claim ends)."""
    max_takeovers: int = DEFAULT_MAX_TAKEOVERS
    """`MAX_TAKEOVERS`: a job whose runs died this many times in a row without finishing (worker
    crash, host kill, function timeout; each seen when the next run takes its expired claim over)
    is poisoned instead of run again. Re-check messages reset the host's dequeue count, so the
    ledger counts these; progress (a checkpoint) and any run that ends start the count again."""
    recovery_interval_s: float = 30.0
    """`RECOVERY_INTERVAL_SECONDS`: how often each worker that processes jobs looks for claims
    that ended without an outcome (one Find Blobs by Tags request) and re-sends their jobs
    (shared/pipeline/recovery.py): a job of a killed host runs again within the claim lease + 10 s + this
    + the queue's polling interval, instead of the host's 10-minute message lease."""
    max_attempts: int = 5
    """`MAX_ATTEMPTS`: transient failures retried by the app before the job is poisoned."""
    retry_base_s: float = 2.0
    """`RETRY_BASE_SECONDS`: first backoff ceiling; doubles each attempt (full jitter)."""
    retry_max_s: float = 300.0
    """`RETRY_MAX_SECONDS`: cap of the backoff ceiling."""
    job_ttl_s: float = 7 * 24 * 3600.0
    """`JOB_TTL_SECONDS`: default expiry after created_at when an envelope has no expires_at."""
    max_payload_bytes: int = 64 * 1024 * 1024
    """`MAX_PAYLOAD_BYTES`: largest payload accepted even by claim check (API answers 413)."""
    max_groups: int = DEFAULT_MAX_GROUPS
    """`MAX_GROUPS`: distinct groups an inline aggregate job may have; past it `engine: auto` goes
    to Spark when a backend is configured, otherwise the job is poisoned naming this setting.
    Measured worst case (`python -m bench.bench_groups`, 2 cores, every row its own group, group_by
    of a 32- and a 10-character column, count + count/sum/mean/min/max of one column), RSS of a
    worker process of ~120 MB after its imports: 50,000 groups completed peak at 238 MB (CSV) /
    214 MB (JSON lines), a job's own ~118 / ~94 MB; refusing a 1M-row input at the cap peaks at
    313-324 MB (~200 MB of its own: two 4 MiB blocks of distinct keys grouped at once, which no
    cap shrinks). 100,000: 283 MB completed, 374 MB refusing; 200,000: 379 MB completed."""
    input_containers: tuple[str, ...] | None = None
    """`INPUT_CONTAINERS`: comma-separated containers jobs may read; None (unset): any container
    that is not internal. The app's and the host's own containers are never readable (see
    `shared.storage.limits.input_refusal`), and listing one here is a settings error."""
    spark: SparkSettings = field(default_factory=SparkSettings)
    """Spark offload settings."""
    retention: RetentionDays = field(default_factory=RetentionDays)
    """`LEDGER_RETENTION_DAYS` (finished records), `RESULTS_RETENTION_DAYS`,
    `PAYLOADS_RETENTION_DAYS`, `ARCHIVE_RETENTION_DAYS` (poison archive entries; reasons 7 days
    longer; edits never): days without modification before deletion, 0 = never. Applied by the
    lifecycle policy in Azure, by `python -m shared.interfaces.cli retention` locally (shared/config/retention.py)."""
    source: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    """The app settings these were read from (the process environment itself in a host): the
    job kinds read their own settings from it (shared/jobs/kinds.py), and the `http` kind its
    secret headers at call time. Never printed (repr=False)."""
    otlp_endpoint: str = ""
    """`OTEL_EXPORTER_OTLP_ENDPOINT`: an OTLP/HTTP collector's base URL (traces to `/v1/traces`,
    metrics to `/v1/metrics`); set, the app exports its spans and metrics there too, next to Azure
    Monitor (shared/observability/telemetry.py). Headers (`OTEL_EXPORTER_OTLP_HEADERS`, e.g. an API key)
    are read by the exporter itself and never logged. '' (unset): no OTLP export."""
    retention_by_app: bool = False
    """`RETENTION_BY_APP` (`true`/`false`): the sweep timer also deletes what the rules make
    due, at most every 5 minutes (shared/pipeline/retention_sweep.py). Off by default: in Azure the lifecycle policy does it at
    no request cost; the local stack (Azurite has no lifecycle policies) turns it on."""

    def retention_rules(self) -> list[Rule]:
        """The retention rules of these settings (shared/config/retention.py)."""
        return rules(
            self.retention,
            self.ledger_container,
            self.results_container,
            self.payloads_container,
            self.poison_archive_container,
        )

    @property
    def queue_set(self) -> QueueSet:
        """The declared queues (the default first)."""
        return self.queues if self.queues is not None else QueueSet.single(self.jobs_queue)

    def for_queue(self, queue: QueueSettings) -> Settings:
        """These settings as one queue's jobs see them: its name, and its own values where it
        sets them (`QUEUE_<NAME>_*`); the kinds read its `HTTP_*` overrides from `source`."""
        return replace(
            self,
            jobs_queue=queue.name,
            job_ttl_s=queue.job_ttl_s if queue.job_ttl_s is not None else self.job_ttl_s,
            max_attempts=queue.max_attempts if queue.max_attempts is not None else self.max_attempts,
            retry_base_s=queue.retry_base_s if queue.retry_base_s is not None else self.retry_base_s,
            retry_max_s=queue.retry_max_s if queue.retry_max_s is not None else self.retry_max_s,
            source=ChainMap(queue.overrides(), cast(MutableMapping[str, str], self.source))
            if queue.overrides()
            else self.source,
        )

    @property
    def poison_queue(self) -> str:
        return f"{self.jobs_queue}-poison"

    # -- console (issue 12) --
    @property
    def parked_queue(self) -> str:
        """Where operators move poisoned messages aside (the console's "park")."""
        return f"{self.jobs_queue}-parked"

    # -- end console --

    def own_containers(self) -> dict[str, str]:
        """The app's own containers, each with the setting that names it."""
        return {
            self.ledger_container: "LEDGER_CONTAINER",
            self.results_container: "RESULTS_CONTAINER",
            self.payloads_container: "PAYLOADS_CONTAINER",
            self.poison_archive_container: "POISON_ARCHIVE_CONTAINER",
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, host_json: Path = HOST_JSON) -> Settings:
        """Read and validate; raises SettingsError naming every bad setting."""
        src = os.environ if env is None else env
        problems: list[str] = []
        reader = SettingReader(src, problems)
        storage = _storage_connection(src, problems)
        host = _host_json(host_json, problems)
        function_timeout = _function_timeout(host, problems)
        lease = reader.number("CLAIM_LEASE_SECONDS", 30.0, 3.0)
        spark = read_spark(reader, function_timeout)
        queues = read_queues(src, problems)
        settings = cls(
            storage=storage,
            jobs_queue=queues.default.name
            if queues.declared
            else reader.resource_name("JOBS_QUEUE", "jobs", max_len=56),
            queues=queues,
            ledger_container=reader.resource_name("LEDGER_CONTAINER", "ledger"),
            results_container=reader.resource_name("RESULTS_CONTAINER", "results"),
            payloads_container=reader.resource_name("PAYLOADS_CONTAINER", "payloads"),
            poison_archive_container=reader.resource_name("POISON_ARCHIVE_CONTAINER", "poison-archive"),
            function_timeout_s=function_timeout,
            max_dequeue_count=_max_dequeue_count(host, problems),
            claim_lease_s=lease,
            heartbeat_s=reader.number("CLAIM_HEARTBEAT_SECONDS", lease / 3, 0.5),
            max_takeovers=reader.integer("MAX_TAKEOVERS", DEFAULT_MAX_TAKEOVERS, 1),
            recovery_interval_s=reader.number("RECOVERY_INTERVAL_SECONDS", 30.0, 5.0),
            max_attempts=reader.integer("MAX_ATTEMPTS", 5, 1),
            retry_base_s=reader.number("RETRY_BASE_SECONDS", 2.0, 0.0),
            retry_max_s=reader.number("RETRY_MAX_SECONDS", 300.0, 0.0),
            job_ttl_s=reader.number("JOB_TTL_SECONDS", 7 * 24 * 3600.0, 1.0),
            max_payload_bytes=reader.integer("MAX_PAYLOAD_BYTES", 64 * 1024 * 1024, 1024),
            max_groups=reader.integer("MAX_GROUPS", DEFAULT_MAX_GROUPS, 1),
            input_containers=_input_containers(src, problems),
            spark=spark,
            retention=RetentionDays(
                ledger=reader.integer("LEDGER_RETENTION_DAYS", RetentionDays.ledger, 0),
                results=reader.integer("RESULTS_RETENTION_DAYS", RetentionDays.results, 0),
                payloads=reader.integer("PAYLOADS_RETENTION_DAYS", RetentionDays.payloads, 0),
                archive=reader.integer("ARCHIVE_RETENTION_DAYS", RetentionDays.archive, 0),
            ),
            retention_by_app=reader.choice("RETENTION_BY_APP", "false", ("true", "false")) == "true",
            source=src,
            otlp_endpoint=reader.url("OTEL_EXPORTER_OTLP_ENDPOINT"),
        )
        longest_ttl = max([settings.job_ttl_s] + [q.job_ttl_s for q in queues if q.job_ttl_s is not None])
        problems.extend(retention_problems(settings.retention, longest_ttl))
        for queue in settings.queue_set:
            mine = settings.for_queue(queue)
            if mine.retry_max_s < mine.retry_base_s:
                problems.append(
                    f"queue {queue.name}: RETRY_MAX_SECONDS ({mine.retry_max_s:g}) must be >= RETRY_BASE_SECONDS "
                    f"({mine.retry_base_s:g}) (QUEUE_<NAME>_ or the app's)"
                )
        problems.extend(check_input_containers(settings.input_containers or (), settings.own_containers()))
        if not settings.heartbeat_s <= settings.claim_lease_s / 2:
            problems.append(
                f"CLAIM_HEARTBEAT_SECONDS ({settings.heartbeat_s:g}) must be at most half of "
                f"CLAIM_LEASE_SECONDS ({settings.claim_lease_s:g}), so a failed renewal can be retried in time"
            )
        if problems:
            raise SettingsError("invalid settings: " + "; ".join(problems))
        return settings


def parse_timespan(text: str) -> float:
    """Parse a .NET TimeSpan as used in host.json ('00:05:00', '1.00:00:00', '-1') to seconds."""
    value = text.strip()
    match = re.fullmatch(r"(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2})(?:\.(\d+))?", value)
    if not match:
        raise ValueError(f"not a TimeSpan (expected [d.]hh:mm:ss): {text!r}")
    days, hours, minutes, seconds, fraction = match.groups()
    total = int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + int(seconds)
    return total + (float(f"0.{fraction}") if fraction else 0.0)


def _host_json(path: Path, problems: list[str]) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        problems.append(f"host.json could not be read ({exc.__class__.__name__})")
        return {}
    return data if isinstance(data, dict) else {}


def _function_timeout(host: Mapping[str, Any], problems: list[str]) -> float:
    raw = host.get("functionTimeout", "00:05:00")
    try:
        return parse_timespan(str(raw))
    except ValueError as exc:
        problems.append(f"host.json functionTimeout: {exc}")
        return 300.0


def _max_dequeue_count(host: Mapping[str, Any], problems: list[str]) -> int:
    queues = (host.get("extensions") or {}).get("queues") or {}
    raw = queues.get("maxDequeueCount", 5)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        problems.append(
            f"host.json extensions.queues.maxDequeueCount: must be a positive integer, got {raw!r}"
        )
        return 5
    return raw


def _input_containers(env: Mapping[str, str], problems: list[str]) -> tuple[str, ...] | None:
    """`INPUT_CONTAINERS`: None when unset; each name must be a valid container name."""
    raw = env.get("INPUT_CONTAINERS", "").strip()
    if not raw:
        return None
    names = tuple(dict.fromkeys(name.strip() for name in raw.split(",") if name.strip()))
    if not names:
        problems.append("INPUT_CONTAINERS lists no container names (leave it unset to allow any)")
    for name in names:
        if not NAME_RE.match(name) and not name.startswith("$"):
            problems.append(
                f"INPUT_CONTAINERS: {name[:80]!r} is not a valid container name "
                "(3-63 lower-case letters, digits and single hyphens)"
            )
    return names


def _storage_connection(
    env: Mapping[str, str], problems: list[str], setting: str = "AzureWebJobsStorage"
) -> StorageConnection:
    """`setting` (`AzureWebJobsStorage`, or another account's) as a connection string, or its
    identity-based settings.

    Identity based (Functions documentation): `__accountName`, or `__blobServiceUri` and
    `__queueServiceUri` (the host and the app use both services); `__serviceUri` is the single-service
    form, read as the blob service. `__credential=managedidentity` with `__clientId` or
    `__managedIdentityResourceId` (neither: `AZURE_CLIENT_ID`, then the system-assigned identity);
    without `__credential` (local development): `__tenantId`, `__clientId` and `__clientSecret` of a
    service principal, or else the developer's own identity.
    """
    conn = env.get(setting, "").strip()
    prefix = setting + "__"

    def get(name: str) -> str | None:
        return env.get(prefix + name, "").strip() or None

    account = get("accountName")
    blob_uri = get("blobServiceUri")
    queue_uri = get("queueServiceUri")
    table_uri = get("tableServiceUri")
    service_uri = get("serviceUri")
    if conn:
        if (
            conn != "UseDevelopmentStorage=true"
            and "AccountName=" not in conn
            and "SharedAccessSignature=" not in conn
        ):
            problems.append(f"{setting} is not a storage connection string (no AccountName=)")
        return StorageConnection(connection_string=conn)
    blob_uri = blob_uri or service_uri
    if account:
        blob_uri = blob_uri or f"https://{account}.blob.core.windows.net"
        queue_uri = queue_uri or f"https://{account}.queue.core.windows.net"
        table_uri = table_uri or f"https://{account}.table.core.windows.net"
    if not (blob_uri and queue_uri):
        if service_uri:
            problems.append(
                f"{setting}__serviceUri names a single service (read as the blob service), but "
                f"the host and the app use blobs and queues: set {setting}__accountName, or "
                f"{setting}__blobServiceUri and {setting}__queueServiceUri"
            )
        else:
            problems.append(
                f"{setting} is not set: give a connection string, or {setting}__accountName, "
                f"or both {setting}__blobServiceUri and {setting}__queueServiceUri"
            )
        return StorageConnection(connection_string="UseDevelopmentStorage=true")
    for name, uri in (
        ("blobServiceUri", blob_uri),
        ("queueServiceUri", queue_uri),
        ("tableServiceUri", table_uri),
    ):
        if uri is not None and not uri.startswith(("https://", "http://")):
            problems.append(f"{setting}__{name} must be an http(s) URL")

    raw_credential = get("credential")
    credential = raw_credential.lower() if raw_credential else None
    client_id = get("clientId")
    resource_id = get("managedIdentityResourceId")
    tenant_id = get("tenantId")
    secret = get("clientSecret")
    if credential == "managedidentity":
        if client_id and resource_id:
            problems.append(
                f"{setting}__clientId and {setting}__managedIdentityResourceId both name "
                "the managed identity: set one of them"
            )
        if secret:
            problems.append(
                f"{setting}__clientSecret is for local development without {setting}__credential; "
                "a managed identity has no secret: remove it"
            )
        if not (client_id or resource_id):
            client_id = env.get("AZURE_CLIENT_ID", "").strip() or None  # documented default
    elif credential == "managedidentityasfederatedidentity":
        problems.append(
            f"{setting}__credential=managedidentityasfederatedidentity (storage in another tenant) "
            "is not supported by this app: use managedidentity with an identity of the account's tenant"
        )
    elif raw_credential is not None:
        problems.append(
            f"{setting}__credential={raw_credential[:40]!r} is not supported: set managedidentity, "
            "or leave it unset for local development"
        )
    else:
        if secret and not (tenant_id and client_id):
            problems.append(
                f"{setting}__clientSecret needs {setting}__tenantId and "
                f"{setting}__clientId (a service principal, local development only)"
            )
        if resource_id:
            problems.append(
                f"{setting}__managedIdentityResourceId is read only with "
                f"{setting}__credential=managedidentity"
            )
    return StorageConnection(
        account_name=account,
        blob_service_uri=blob_uri,
        queue_service_uri=queue_uri,
        table_service_uri=table_uri,
        client_id=client_id,
        credential=credential,
        managed_identity_resource_id=resource_id if credential == "managedidentity" else None,
        tenant_id=tenant_id,
        client_secret=secret if credential is None else None,
    )


def storage_connection(env: Mapping[str, str], setting: str) -> StorageConnection:
    """The storage account `setting` names in `env` (a connection string, or `<setting>__*` identity
    settings, read as `AzureWebJobsStorage` is); SettingsError listing every problem."""
    problems: list[str] = []
    conn = _storage_connection(env, problems, setting)
    if problems:
        raise SettingsError("; ".join(problems))
    return conn
