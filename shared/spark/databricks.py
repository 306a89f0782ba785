"""Databricks Jobs API 2.2 one-time runs (`runs/submit`) with an idempotency token.

The token is derived from (job id, submission number), so re-posting the same submission after
a read timeout returns the run that already exists instead of starting a second one: here a
retry is safe, and `find` is that same idempotent re-post.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from shared.core.errors import DownstreamUnavailable, PermanentError
from shared.core.setting_reader import SettingReader
from shared.spark.config import SparkSettings
from shared.spark.model import RunStatus, SparkJobRequest, Submission
from shared.spark.states import databricks_status
from shared.spark.transport import ReadTimedOut, RestBackend, json_body, scrub

AZURE_DATABRICKS_SCOPE = "2ff814a6-3304-4ab8-85cb-cd0e6f879c1d/.default"
API = "/api/2.2/jobs"
_TIMEOUT_RETRIES = 1  # extra attempts after a read timeout, with the same token


def idempotency_token(job_id: str, submission: int) -> str:
    """`<job id>:s<n>`, or a digest of the job id when that would pass the 64-character limit."""
    token = f"{job_id}:s{submission}"
    if len(token) <= 64:
        return token
    return "h" + hashlib.sha256(job_id.encode()).hexdigest()[:52] + f":s{submission}"


@dataclass(frozen=True)
class DatabricksOptions:
    """Settings of the Databricks backend."""

    auth: str = "entra"
    """`SPARK_DATABRICKS_AUTH`: entra (token of the app's identity) | token (a PAT)."""
    token: str = field(default="", repr=False)
    """`SPARK_DATABRICKS_TOKEN` (auth token)."""
    cluster: tuple[tuple[str, Any], ...] = ()
    """From `SPARK_DATABRICKS_CLUSTER_ID` (existing_cluster_id) or `SPARK_DATABRICKS_NEW_CLUSTER`
    (new_cluster, a JSON object)."""
    run_timeout_s: int = 0
    """`SPARK_DATABRICKS_RUN_TIMEOUT_SECONDS`: the run's own timeout_seconds (0: none)."""
    server_timeout_s: float = 10.0
    """`SPARK_DOWNSTREAM_TIMEOUT_SECONDS`: how long the API may take to answer a runs/submit."""

    @classmethod
    def read(cls, r: SettingReader, url: str) -> DatabricksOptions:
        del url
        auth = r.choice("SPARK_DATABRICKS_AUTH", "entra", ("entra", "token"))
        token = r.secret("SPARK_DATABRICKS_TOKEN")
        if auth == "token" and not token:
            r.problem("SPARK_DATABRICKS_AUTH=token needs SPARK_DATABRICKS_TOKEN")
        try:
            cluster = _cluster_spec(
                r.text("SPARK_DATABRICKS_CLUSTER_ID", ""), r.text("SPARK_DATABRICKS_NEW_CLUSTER", "")
            )
        except PermanentError as exc:
            r.problem(str(exc))
            cluster = {}
        return cls(
            auth=auth,
            token=token,
            cluster=tuple(cluster.items()),
            run_timeout_s=r.integer("SPARK_DATABRICKS_RUN_TIMEOUT_SECONDS", 0, 0),
            server_timeout_s=r.number("SPARK_DOWNSTREAM_TIMEOUT_SECONDS", 10.0, 0.1),
        )


class DatabricksBackend(RestBackend[DatabricksOptions]):
    """`SPARK_URL` is the workspace URL (https://adb-<id>.<n>.azuredatabricks.net)."""

    name = "databricks"
    options_type = DatabricksOptions

    def setup(self, spark: SparkSettings) -> None:
        self.base = spark.url.rstrip("/") + API
        self.cluster: dict[str, Any] = dict(self.opts.cluster)
        self.run_timeout_s = self.opts.run_timeout_s

    def _headers(self) -> dict[str, str]:
        if self.opts.auth == "token":
            return {"Authorization": "Bearer " + self.opts.token}
        return {"Authorization": "Bearer " + self.token(AZURE_DATABRICKS_SCOPE)}

    def submit_body(self, job: SparkJobRequest) -> dict[str, Any]:
        task: dict[str, Any] = {
            "task_key": "main",  # the one task of a one-time run
            "spark_python_task": {"python_file": job.job_file, "parameters": list(job.args)},
            **self.cluster,
        }
        body: dict[str, Any] = {
            "run_name": job.name,
            "idempotency_token": idempotency_token(job.job_id, job.submission),
            "tasks": [task],
        }
        if self.run_timeout_s:
            body["timeout_seconds"] = self.run_timeout_s
        return body

    def submit(self, job: SparkJobRequest) -> Submission:
        started = self.clock()
        body = self.submit_body(job)
        for attempt in range(_TIMEOUT_RETRIES + 1):
            try:
                resp = self.http.request("POST", f"{self.base}/runs/submit", json=body)
            except ReadTimedOut:
                if attempt == _TIMEOUT_RETRIES:
                    return Submission(self.name, None, job.name, started)
                continue  # same idempotency token: returns the existing run if the first went through
            data = json_body(resp, self.name)
            if data.get("run_id") is None:
                raise PermanentError("databricks: runs/submit answered without a run_id")
            return Submission(self.name, str(data["run_id"]), job.name, started)
        raise AssertionError("unreachable")

    def find(self, job: SparkJobRequest) -> Submission | None:
        """Re-post with the same idempotency token: the existing run's id (or the run, started once)."""
        try:
            resp = self.http.request("POST", f"{self.base}/runs/submit", json=self.submit_body(job))
        except ReadTimedOut:
            return None
        data = json_body(resp, self.name)
        return (
            None
            if data.get("run_id") is None
            else Submission(self.name, str(data["run_id"]), job.name, self.clock())
        )

    def status(self, submission_id: str) -> RunStatus:
        resp = self.http.request(
            "GET", f"{self.base}/runs/get", params={"run_id": submission_id}, allow=(400, 404)
        )
        if resp.status_code in (400, 404):
            code = _error_code(resp.text)
            if resp.status_code == 404 or code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return RunStatus("unknown", f"Databricks does not know run {submission_id}", code or "404")
            raise PermanentError(f"databricks: HTTP {resp.status_code} on runs/get: {scrub(resp.text or '')}")
        body = json_body(resp, self.name)
        status = databricks_status(body)
        if status.state == "failed":
            error = self._task_error(body)
            if error:
                return RunStatus(status.state, f"{status.message}: {error}", status.raw_state)
        return status

    def cancel(self, submission_id: str) -> None:
        self.http.request(
            "POST", f"{self.base}/runs/cancel", json={"run_id": int(submission_id)}, allow=(400, 404)
        )

    def _task_error(self, run: dict[str, Any]) -> str:
        """The task's error from runs/get-output (best effort)."""
        tasks = run.get("tasks") or []
        task_run = tasks[0].get("run_id") if tasks and isinstance(tasks[0], dict) else None
        if task_run is None:
            return ""
        try:
            resp = self.http.request(
                "GET", f"{self.base}/runs/get-output", params={"run_id": task_run}, allow=(400, 404)
            )
        except (DownstreamUnavailable, PermanentError):
            return ""
        if resp.status_code != 200:
            return ""
        data = json_body(resp, self.name)
        return scrub(str(data.get("error") or ""))


def _cluster_spec(cluster_id: str | None, new_cluster: str | None) -> dict[str, Any]:
    if cluster_id:
        return {"existing_cluster_id": cluster_id}
    if new_cluster:
        try:
            spec = json.loads(new_cluster)
        except ValueError:
            raise PermanentError("SPARK_DATABRICKS_NEW_CLUSTER is not valid JSON") from None
        if not isinstance(spec, dict):
            raise PermanentError("SPARK_DATABRICKS_NEW_CLUSTER must be a JSON object")
        return {"new_cluster": spec}
    raise PermanentError(
        "SPARK_BACKEND=databricks needs SPARK_DATABRICKS_CLUSTER_ID or SPARK_DATABRICKS_NEW_CLUSTER"
    )


def _error_code(text: str) -> str:
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return ""
    return str(data.get("error_code") or "") if isinstance(data, dict) else ""
