"""The Spark settings every backend shares, typed; each backend's own settings sit next to it.

`SparkSettings` is read once at start-up (`shared.spark.backends.read_spark`) and validated there,
so a wrong value is refused naming the setting before any job runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from shared.core.setting_reader import SettingReader

MAX_THROTTLE_RETRIES = 2
"""429 answers waited out in-process per request (each at most SPARK_RETRY_AFTER_MAX_SECONDS)."""
STEP_MARGIN_S = 60.0
"""Time an invocation keeps, besides its Spark step, for storage work (claim, ledger, result)."""


class BackendOptions(Protocol):
    """A backend's own typed settings."""

    @property
    def server_timeout_s(self) -> float:
        """How long the backend's API itself may work on a create before answering."""
        ...


@dataclass(frozen=True)
class SparkSettings:
    """Where and how large work is handed to Spark (settings common to every backend)."""

    backend: str = "none"
    """`SPARK_BACKEND`: none, or a backend of `shared.spark.backends.BACKENDS`."""
    url: str = ""
    """`SPARK_URL`: the submission API's base URL (standalone REST, Livy batches, Databricks host,
    the Fabric REST API: its default for `fabric`)."""
    job_file: str = ""
    """`SPARK_JOB_FILE`: where the cluster finds spark_jobs/aggregate_job.py (path or URL)."""
    py_files: tuple[str, ...] = ()
    """`SPARK_PY_FILES`: comma-separated pyFiles (the engine zip on Azure services)."""
    offload_threshold_bytes: int = 4 * 1024**3
    """`SPARK_OFFLOAD_THRESHOLD_BYTES`: `engine: auto` sends inputs larger than this to Spark."""
    connect_timeout_s: float = 5.0
    """`SPARK_CONNECT_TIMEOUT_SECONDS`: TCP connect timeout of the submission client."""
    read_timeout_s: float = 30.0
    """`SPARK_READ_TIMEOUT_SECONDS`: read timeout of the submission client."""
    retry_after_max_s: float = 10.0
    """`SPARK_RETRY_AFTER_MAX_SECONDS`: longest Retry-After waited in-process (longer: check later)."""
    step_budget_s: float = 150.0
    """`SPARK_STEP_BUDGET_SECONDS`: all the Spark calls of one invocation (connects, reads,
    retries, Retry-After waits) end within this; a call that would pass it is not made. Default:
    150 s, or one call at its worst (`request_worst_case_s`) when that is longer."""
    max_submissions: int = 3
    """`SPARK_MAX_SUBMISSIONS`: submissions per job before it is poisoned."""
    poll_initial_s: int = 10
    """`SPARK_POLL_INITIAL_SECONDS`: delay before the first status check; it then grows."""
    poll_max_s: int = 300
    """`SPARK_POLL_MAX_SECONDS`: cap of the growing status-check delay."""
    run_timeout_s: float = 6 * 3600.0
    """`SPARK_RUN_TIMEOUT_SECONDS`: a submission still live (or unreachable) this long after it
    was made is cancelled on the cluster and counts as a failed submission."""
    confirm_window_s: float = 120.0
    """`SPARK_CONFIRM_WINDOW_SECONDS`: how long a submit the API did not confirm is looked up
    before the API's answer "not there" counts as a failed submission."""
    max_concurrent_runs: int = 0
    """`SPARK_MAX_CONCURRENT_RUNS`: runs in flight at once across instances (0: no cap)."""
    split_mb: float | None = None
    """`SPARK_SPLIT_MB`: input split size of the job (None: the job's default)."""
    storage_access: str = ""
    """`SPARK_STORAGE_ACCESS`: blob-sdk | hadoop ('' : by backend)."""
    storage_url_template: str = "abfss://{container}@{account}.dfs.core.windows.net/{path}"
    """`SPARK_STORAGE_URL_TEMPLATE`: how the cluster names a blob in `hadoop` mode."""
    options: BackendOptions | None = field(default=None, repr=False)
    """The backend's own settings (`StandaloneOptions`, `LivyOptions`, `DatabricksOptions`,
    `FabricOptions`)."""

    def request_worst_case_s(self) -> float:
        """The longest one HTTP call may take: connect + read, retried after each waited 429."""
        per_try = self.connect_timeout_s + self.read_timeout_s
        return (MAX_THROTTLE_RETRIES + 1) * per_try + MAX_THROTTLE_RETRIES * self.retry_after_max_s


def read_common(
    r: SettingReader, backend: str, max_concurrent_default: int, url_default: str = ""
) -> SparkSettings:
    """The settings shared by every backend (options are added by the caller)."""
    raw_py = r.text("SPARK_PY_FILES", "")
    split = r.number("SPARK_SPLIT_MB", 0.0, 0.0)
    return SparkSettings(
        backend=backend,
        url=r.url("SPARK_URL", url_default),
        job_file=r.text("SPARK_JOB_FILE", ""),
        py_files=tuple(p.strip() for p in raw_py.split(",") if p.strip()),
        offload_threshold_bytes=r.integer("SPARK_OFFLOAD_THRESHOLD_BYTES", 4 * 1024**3, 0),
        connect_timeout_s=r.number("SPARK_CONNECT_TIMEOUT_SECONDS", 5.0, 0.1),
        read_timeout_s=r.number("SPARK_READ_TIMEOUT_SECONDS", 30.0, 0.1),
        retry_after_max_s=r.number("SPARK_RETRY_AFTER_MAX_SECONDS", 10.0, 0.0),
        step_budget_s=r.number("SPARK_STEP_BUDGET_SECONDS", 150.0, 1.0),
        max_submissions=r.integer("SPARK_MAX_SUBMISSIONS", 3, 1),
        poll_initial_s=r.integer("SPARK_POLL_INITIAL_SECONDS", 10, 1),
        poll_max_s=r.integer("SPARK_POLL_MAX_SECONDS", 300, 1),
        run_timeout_s=r.number("SPARK_RUN_TIMEOUT_SECONDS", 6 * 3600.0, 60.0),
        confirm_window_s=r.number("SPARK_CONFIRM_WINDOW_SECONDS", 120.0, 0.0),
        max_concurrent_runs=r.integer("SPARK_MAX_CONCURRENT_RUNS", max_concurrent_default, 0),
        split_mb=split or None,
        storage_access=r.choice("SPARK_STORAGE_ACCESS", "", ("", "blob-sdk", "hadoop")),
        storage_url_template=r.text(
            "SPARK_STORAGE_URL_TEMPLATE", "abfss://{container}@{account}.dfs.core.windows.net/{path}"
        ),
    )
