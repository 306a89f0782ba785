"""Apache Livy batches: Azure Synapse Spark pools (Entra token) and HDInsight (basic auth).

Livy has no idempotency key, so after a read timeout on create (or a "duplicate name" answer)
the batch is looked up by its unique name before anything else is tried. A batch id Livy no
longer knows (404: finished batches are forgotten after a retention period) maps to `unknown`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.core.errors import PermanentError
from shared.core.setting_reader import SettingReader
from shared.spark.config import SparkSettings
from shared.spark.model import RunStatus, SparkJobRequest, Submission
from shared.spark.states import livy_status
from shared.spark.transport import ReadTimedOut, RestBackend, json_body, scrub

SYNAPSE_SCOPE = "https://dev.azuresynapse.net/.default"
_PAGE = 100


@dataclass(frozen=True)
class LivyOptions:
    """Settings of the Livy backend (Synapse, HDInsight)."""

    auth: str = "entra"
    """`SPARK_LIVY_AUTH`: entra (token of the app's identity) | basic | none."""
    scope: str = SYNAPSE_SCOPE
    """`SPARK_LIVY_SCOPE`: the Entra token's scope."""
    user: str = ""
    """`SPARK_LIVY_USER` (basic)."""
    password: str = field(default="", repr=False)
    """`SPARK_LIVY_PASSWORD` (basic)."""
    sizes: tuple[tuple[str, str | int], ...] = ()
    """driverMemory, driverCores, executorMemory, executorCores, numExecutors of the batch, from
    SPARK_DRIVER_MEMORY, SPARK_DRIVER_CORES, SPARK_EXECUTOR_MEMORY, SPARK_EXECUTOR_CORES,
    SPARK_NUM_EXECUTORS (unset: the pool's defaults)."""
    server_timeout_s: float = 10.0
    """`SPARK_DOWNSTREAM_TIMEOUT_SECONDS`: how long the Livy server may take to answer a create."""

    @classmethod
    def read(cls, r: SettingReader, url: str) -> LivyOptions:
        del url
        auth = r.choice("SPARK_LIVY_AUTH", "entra", ("entra", "basic", "none"))
        user, password = r.text("SPARK_LIVY_USER", ""), r.secret("SPARK_LIVY_PASSWORD")
        if auth == "basic" and not (user and password):
            r.problem("SPARK_LIVY_AUTH=basic needs SPARK_LIVY_USER and SPARK_LIVY_PASSWORD")
        return cls(
            auth=auth,
            scope=r.text("SPARK_LIVY_SCOPE", SYNAPSE_SCOPE),
            user=user,
            password=password,
            sizes=batch_sizes(r),
            server_timeout_s=r.number("SPARK_DOWNSTREAM_TIMEOUT_SECONDS", 10.0, 0.1),
        )


def batch_sizes(r: SettingReader) -> tuple[tuple[str, str | int], ...]:
    """The batch's driver and executor sizes from SPARK_DRIVER_MEMORY ... SPARK_NUM_EXECUTORS."""
    sizes: list[tuple[str, str | int]] = []
    for name, key in (
        ("SPARK_DRIVER_MEMORY", "driverMemory"),
        ("SPARK_EXECUTOR_MEMORY", "executorMemory"),
    ):
        if r.text(name, ""):
            sizes.append((key, r.text(name, "")))
    for name, key in (
        ("SPARK_DRIVER_CORES", "driverCores"),
        ("SPARK_EXECUTOR_CORES", "executorCores"),
        ("SPARK_NUM_EXECUTORS", "numExecutors"),
    ):
        if r.text(name, ""):
            sizes.append((key, r.integer(name, 1, 1)))
    return tuple(sizes)


class LivyBackend(RestBackend[LivyOptions]):
    """`SPARK_URL` is the Livy root that `/batches` hangs off (Synapse: .../sparkPools/<pool>)."""

    name = "livy"
    options_type = LivyOptions

    def setup(self, spark: SparkSettings) -> None:
        self.batches = spark.url.rstrip("/") + "/batches"
        self.sizes: dict[str, Any] = dict(self.opts.sizes)

    def basic_auth(self) -> tuple[str, str] | None:
        return (self.opts.user, self.opts.password) if self.opts.auth == "basic" else None

    def _headers(self) -> dict[str, str]:
        headers = {"X-Requested-By": "jobs", "Content-Type": "application/json"}
        if self.opts.auth == "entra":
            headers["Authorization"] = "Bearer " + self.token(self.opts.scope)
        return headers

    def create_body(self, job: SparkJobRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "file": job.job_file,
            "args": list(job.args),
            "name": job.name,
            "tags": job.tags,
            "conf": dict(job.conf),
            **self.sizes,
        }
        if job.py_files:
            body["pyFiles"] = list(job.py_files)
        return body

    def submit(self, job: SparkJobRequest) -> Submission:
        started = self.clock()
        try:
            resp = self.http.request("POST", self.batches, json=self.create_body(job), allow=(400, 409))
        except ReadTimedOut:
            return self.find(job) or Submission(self.name, None, job.name, started)
        if resp.status_code in (400, 409):
            text = scrub(resp.text or "")
            if "duplicate" in text.lower():  # our earlier, timed-out create went through
                found = self.find(job)
                if found is not None:
                    return found
            raise PermanentError(f"livy: HTTP {resp.status_code} on POST /batches: {text}")
        body = json_body(resp, self.name)
        if body.get("id") is None:
            raise PermanentError("livy: the create answer has no batch id")
        return Submission(self.name, str(body["id"]), job.name, started)

    def status(self, submission_id: str) -> RunStatus:
        resp = self.http.request("GET", f"{self.batches}/{submission_id}", allow=(404,))
        if resp.status_code == 404:
            return RunStatus(
                "unknown", f"Livy no longer knows batch {submission_id} (retention passed?)", "404"
            )
        body = json_body(resp, self.name)
        status = livy_status(body)
        if status.state == "failed":
            tail = log_tail(body.get("log"))
            if tail:
                return RunStatus(status.state, f"{status.message}: {tail}", status.raw_state)
        return status

    def cancel(self, submission_id: str) -> None:
        self.http.request(
            "DELETE",
            f"{self.batches}/{submission_id}",
            allow=(404,),
            read_timeout_s=2 * self.http.read_timeout_s,
        )

    def find(self, job: SparkJobRequest) -> Submission | None:
        """The newest batch named `job.name` (or tagged with its job id and submission)."""
        first = json_body(
            self.http.request("GET", self.batches, params={"from": 0, "size": _PAGE}), self.name
        )
        sessions = list(first.get("sessions") or [])
        total = int(first.get("total") or len(sessions))
        if total > len(sessions):
            start = max(0, total - _PAGE)
            last = json_body(
                self.http.request("GET", self.batches, params={"from": start, "size": _PAGE}), self.name
            )
            sessions += list(last.get("sessions") or [])
        matches = [s for s in sessions if is_ours(s, job)]
        if not matches:
            return None
        newest = max(matches, key=lambda s: int(s.get("id") or 0))
        return Submission(self.name, str(newest["id"]), job.name, self.clock())


def is_ours(batch: Mapping[str, Any], job: SparkJobRequest) -> bool:
    """The batch is this request's: same name, or tagged with its job id and submission."""
    if batch.get("name") == job.name:
        return True
    tags = batch.get("tags") or {}
    return isinstance(tags, Mapping) and dict(tags) == job.tags


def log_tail(log: Any, lines: int = 5) -> str:
    """The driver's error line from a batch log (or its last lines), scrubbed."""
    if not isinstance(log, list):
        return ""
    useful = [str(x).strip() for x in log if str(x).strip() and not str(x).startswith(("stdout:", "stderr:"))]
    for line in reversed(useful):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return scrub(line)
    return scrub(" | ".join(useful[-lines:]))
