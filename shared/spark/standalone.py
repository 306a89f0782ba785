"""Spark standalone REST submission API (`/v1/submissions/*` on the master's REST port).

The API has no idempotency key: posting the same body twice starts two drivers. So after a read
timeout on create the run is looked up (master JSON lists drivers; each launched driver's launch
command, served by its worker's log endpoint, carries `-Dspark.app.name=<unique name>`) and only
a run that cannot be found is left unconfirmed for the tracking layer to decide about.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from shared.core.errors import DownstreamUnavailable, PermanentError
from shared.core.setting_reader import SettingReader
from shared.spark.config import SparkSettings
from shared.spark.model import RunStatus, SparkJobRequest, Submission
from shared.spark.states import standalone_status
from shared.spark.transport import ReadTimedOut, RestBackend, json_body, scrub

PYTHON_RUNNER = "org.apache.spark.deploy.PythonRunner"
_LOOKUP_LIMIT = 25  # newest drivers whose launch command is inspected by `find`
_LAUNCHED = "Launch Command:"  # the first line a worker writes to a driver's stderr when it starts it


def jws_token(secret_b64url: str, now: float) -> str:
    """An HS256 JWS for Spark's JWSFilter (`spark.master.rest.filters`); the key is base64url."""
    key = base64.urlsafe_b64decode(secret_b64url + "=" * (-len(secret_b64url) % 4))

    def enc(obj: Mapping[str, Any]) -> bytes:
        return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).rstrip(b"=")

    signing_input = enc({"alg": "HS256", "typ": "JWT"}) + b"." + enc({"iat": int(now), "sub": "jobs"})
    signature = base64.urlsafe_b64encode(hmac.new(key, signing_input, hashlib.sha256).digest()).rstrip(b"=")
    return (signing_input + b"." + signature).decode()


@dataclass(frozen=True)
class StandaloneOptions:
    """Settings of the standalone backend."""

    master_url: str = ""
    """`SPARK_MASTER_URL`: spark://host:port the driver registers with (default: SPARK_URL's host, 7077)."""
    ui_url: str = ""
    """`SPARK_MASTER_UI_URL` (required): the master's web UI, where `find` looks drivers up."""
    client_version: str = "4.3.0"
    """`SPARK_CLIENT_VERSION`: clientSparkVersion of the REST body."""
    python: str = "python3"
    """`SPARK_PYTHON`: the Python of driver and executors."""
    driver_memory: str = "1g"
    """`SPARK_DRIVER_MEMORY`."""
    executor_memory: str = "1g"
    """`SPARK_EXECUTOR_MEMORY`."""
    cores_max: int = 2
    """`SPARK_CORES_MAX`: cores one run may take (spark.cores.max)."""
    rest_auth_secret: str = field(default="", repr=False)
    """`SPARK_REST_AUTH_SECRET`: base64url HS256 key of the master's JWSFilter (empty: none)."""
    server_timeout_s: float = 120.0
    """`SPARK_MASTER_ASK_TIMEOUT_SECONDS`: the master's spark.rpc.askTimeout, how long a create
    may take before it answers. Longer than the read timeout: a timed-out create is then looked up
    in the master's UI (why SPARK_MASTER_UI_URL is required), never posted again."""

    @classmethod
    def read(cls, r: SettingReader, url: str) -> StandaloneOptions:
        host = urlparse(url).hostname or "127.0.0.1"
        ui_url = r.url("SPARK_MASTER_UI_URL")
        if not ui_url:
            r.problem(
                "SPARK_MASTER_UI_URL is required when SPARK_BACKEND=standalone: the REST API has no "
                "idempotency key, and without the master's UI a timed-out submit cannot be looked up "
                "(a second driver would start)"
            )
        secret = r.secret("SPARK_REST_AUTH_SECRET")
        if secret and not re.fullmatch(r"[A-Za-z0-9_-]+=*", secret):
            r.problem("SPARK_REST_AUTH_SECRET is not base64url text (value not shown)")
        return cls(
            master_url=r.text("SPARK_MASTER_URL", f"spark://{host}:7077"),
            ui_url=ui_url,
            client_version=r.text("SPARK_CLIENT_VERSION", "4.3.0"),
            python=r.text("SPARK_PYTHON", "python3"),
            driver_memory=r.text("SPARK_DRIVER_MEMORY", "1g"),
            executor_memory=r.text("SPARK_EXECUTOR_MEMORY", "1g"),
            cores_max=r.integer("SPARK_CORES_MAX", 2, 1),
            rest_auth_secret=secret,
            server_timeout_s=r.number("SPARK_MASTER_ASK_TIMEOUT_SECONDS", 120.0, 1.0),
        )


class StandaloneBackend(RestBackend[StandaloneOptions]):
    """Submits PySpark jobs in cluster mode through the standalone master's REST API."""

    name = "standalone"
    options_type = StandaloneOptions

    def setup(self, spark: SparkSettings) -> None:
        opts = self.opts
        self.url = spark.url.rstrip("/")
        self.master_url = opts.master_url
        self.ui_url = opts.ui_url
        self.client_version = opts.client_version
        self.python = opts.python
        self.props = {
            "spark.driver.memory": opts.driver_memory,
            "spark.driver.cores": "1",
            "spark.executor.memory": opts.executor_memory,
            "spark.cores.max": str(opts.cores_max),
        }
        self._secret = opts.rest_auth_secret

    def _headers(self) -> dict[str, str]:
        if not self._secret:
            return {}
        return {"Authorization": "Bearer " + jws_token(self._secret, self.clock())}

    def create_body(self, job: SparkJobRequest) -> dict[str, Any]:
        """The CreateSubmissionRequest for a PySpark script (appArgs: script, pyFiles, job args)."""
        is_url = "://" in job.job_file
        resource = job.job_file if is_url else "file:" + job.job_file
        script = job.job_file.rsplit("/", 1)[-1] if is_url else job.job_file
        props = {
            "spark.master": self.master_url,
            "spark.submit.deployMode": "cluster",
            "spark.app.name": job.name,
            "spark.driver.supervise": "false",
            **self.props,
            "spark.pyspark.python": self.python,
            "spark.pyspark.driver.python": self.python,
            "spark.submit.pyFiles": ",".join(job.py_files),
            # REST submissions skip spark-submit, which would ship pyFiles to the executors.
            **({"spark.files": ",".join(job.py_files)} if job.py_files else {}),
            **dict(job.conf),
        }
        return {
            "action": "CreateSubmissionRequest",
            "clientSparkVersion": self.client_version,
            "appResource": resource,
            "mainClass": PYTHON_RUNNER,
            "appArgs": [script, ",".join(job.py_files), *job.args],
            "environmentVariables": {"SPARK_ENV_LOADED": "1", **dict(job.env)},
            "sparkProperties": props,
        }

    def submit(self, job: SparkJobRequest) -> Submission:
        started = self.clock()
        try:
            resp = self.http.request("POST", f"{self.url}/v1/submissions/create", json=self.create_body(job))
        except ReadTimedOut:
            found = self.find(job)
            return found or Submission(self.name, None, job.name, started)
        body = json_body(resp, self.name)
        if body.get("success") is not True or not body.get("submissionId"):
            message = scrub(str(body.get("message") or "no message"))
            if "ALIVE" in message:  # master recovering or standby
                raise DownstreamUnavailable(f"standalone: master cannot accept submissions now: {message}")
            raise PermanentError(f"standalone: master refused the submission: {message}")
        return Submission(self.name, str(body["submissionId"]), job.name, started)

    def status(self, submission_id: str) -> RunStatus:
        resp = self.http.request("GET", f"{self.url}/v1/submissions/status/{submission_id}")
        status = standalone_status(json_body(resp, self.name))
        if status.state == "failed":
            tail = self._driver_error(submission_id, status)
            if tail:
                return RunStatus(status.state, tail, status.raw_state)
        return status

    def cancel(self, submission_id: str) -> None:
        self.http.request("POST", f"{self.url}/v1/submissions/kill/{submission_id}")

    def find(self, job: SparkJobRequest) -> Submission | None:
        """Look for a driver launched with our app name in the master's UI (SPARK_MASTER_UI_URL).

        A driver's app name shows only in the launch command its worker writes when it starts it.
        While a newer driver is active but not started yet, it may be ours: rather than answer
        "not found" (and let the caller submit twice), this raises DownstreamUnavailable, to look
        again later.
        """
        if not self.ui_url:  # refused at start-up; never answer "not found" without looking
            raise PermanentError("standalone: SPARK_MASTER_UI_URL is not set: cannot look up a submission")
        state = json_body(self.http.request("GET", f"{self.ui_url}/json/"), self.name)
        workers = {str(w.get("id")): str(w.get("webuiaddress") or "") for w in state.get("workers", [])}
        active = {str(d.get("id")) for d in state.get("activedrivers", [])}
        drivers = list(state.get("activedrivers", [])) + list(state.get("completeddrivers", []))
        drivers.sort(key=lambda d: str(d.get("id")), reverse=True)  # ids sort by submit time
        marker = f'"-Dspark.app.name={job.name}"'
        not_started = []
        for driver in drivers[:_LOOKUP_LIMIT]:
            driver_id = str(driver.get("id"))
            worker_ui = workers.get(str(driver.get("worker")), "")
            head = self._log_head(worker_ui, driver_id, "stderr", 16384) if worker_ui else ""
            if marker in head:
                return Submission(self.name, driver_id, job.name, _starttime(driver) or self.clock())
            if driver_id in active and _LAUNCHED not in head:
                not_started.append(driver_id)
        if not_started:
            raise DownstreamUnavailable(
                f"standalone: cannot tell yet whether {job.name} was submitted: driver(s) "
                f"{', '.join(not_started)} have not started; looking again later instead of submitting twice"
            )
        return None

    def _log_head(
        self, worker_ui: str, driver_id: str, log_type: str, length: int, offset: int | None = 0
    ) -> str:
        """A slice of a driver's log from its worker's UI; `offset=None` gives the tail."""
        params: dict[str, Any] = {"driverId": driver_id, "logType": log_type, "byteLength": length}
        if offset is not None:
            params["offset"] = offset
        resp = self.http.request("GET", f"{worker_ui}/log/", params=params, allow=(404,))
        return "" if resp.status_code == 404 else str(resp.text)

    def _driver_error(self, submission_id: str, status: RunStatus) -> str:
        """Best effort: the last Python error lines of the driver's stderr (worker log endpoint)."""
        if not self.ui_url:
            return status.message
        try:
            state = json_body(self.http.request("GET", f"{self.ui_url}/json/"), self.name)
            drivers = list(state.get("activedrivers", [])) + list(state.get("completeddrivers", []))
            worker_id = next((d.get("worker") for d in drivers if d.get("id") == submission_id), None)
            worker_ui = next(
                (str(w.get("webuiaddress")) for w in state.get("workers", []) if w.get("id") == worker_id), ""
            )
            if not worker_ui:
                return status.message
            text = self._log_head(worker_ui, submission_id, "stderr", 8192, offset=None)
        except (DownstreamUnavailable, PermanentError):
            return status.message
        return driver_error_from_log(text) or status.message


def driver_error_from_log(text: str) -> str:
    """The most telling line of a driver log tail: the last Python exception line, if any."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return scrub(line)
    return ""


def _starttime(driver: Mapping[str, Any]) -> float | None:
    try:
        return float(driver.get("starttime") or 0) / 1000.0 or None
    except (TypeError, ValueError):
        return None
