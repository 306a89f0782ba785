"""Microsoft Fabric: Livy batches on a lakehouse, with an Entra token of a managed identity or a
service principal.

`POST {SPARK_URL}/workspaces/{workspace}/lakehouses/{lakehouse}/livyApi/versions/{version}/batches`
creates a batch (answer 202 with its id, a GUID), `GET .../batches/{id}` gives its state,
`DELETE .../batches/{id}` cancels it. Like Livy there is no idempotency key: after a read timeout
on create (or a "duplicate" answer) the batch is looked up by its unique name before anything else
is tried; an id Fabric no longer knows (404) maps to `unknown`. HTTP 430 (capacity full,
"TooManyRequestsForCapacity") is transient, like 429.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.core.errors import DownstreamUnavailable, PermanentError
from shared.core.setting_reader import SettingReader
from shared.spark.config import SparkSettings
from shared.spark.livy import batch_sizes, is_ours, log_tail
from shared.spark.model import RunStatus, SparkJobRequest, Submission
from shared.spark.states import fabric_status
from shared.spark.transport import ReadTimedOut, RestBackend, TokenCredential, scrub

FABRIC_API = "https://api.fabric.microsoft.com/v1"
FABRIC_SCOPE = "https://api.fabric.microsoft.com/.default"
LIVY_API_VERSION = "2023-12-01"
CAPACITY_FULL = 430
"""Fabric's answer when the capacity's Spark cores or queue are used up: try again later."""
AUTH_MODES = ("managed-identity", "service-principal", "default")
_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_PAGE = 100


@dataclass(frozen=True)
class FabricOptions:
    """Settings of the Fabric backend."""

    workspace_id: str = ""
    """`SPARK_FABRIC_WORKSPACE_ID`: the workspace (GUID) holding the lakehouse."""
    lakehouse_id: str = ""
    """`SPARK_FABRIC_LAKEHOUSE_ID`: the lakehouse (GUID) the batches run on."""
    api_version: str = LIVY_API_VERSION
    """`SPARK_FABRIC_LIVY_API_VERSION`: the Livy API version in the path."""
    auth: str = "managed-identity"
    """`SPARK_FABRIC_AUTH`: managed-identity | service-principal | default (DefaultAzureCredential)."""
    scope: str = FABRIC_SCOPE
    """`SPARK_FABRIC_SCOPE`: the Entra token's scope."""
    tenant_id: str = ""
    """`SPARK_FABRIC_TENANT_ID` (service-principal)."""
    client_id: str = ""
    """`SPARK_FABRIC_CLIENT_ID`: the service principal's app id, or a user-assigned managed
    identity's client id (unset: `AZURE_CLIENT_ID`, else the system-assigned identity)."""
    client_secret: str = field(default="", repr=False)
    """`SPARK_FABRIC_CLIENT_SECRET` (service-principal; or a certificate)."""
    certificate_path: str = ""
    """`SPARK_FABRIC_CERTIFICATE_PATH` (service-principal; PEM with the private key)."""
    environment_id: str = ""
    """`SPARK_FABRIC_ENVIRONMENT_ID`: a Fabric environment (GUID) for the batches ('' : the
    workspace's starter pool)."""
    sizes: tuple[tuple[str, str | int], ...] = ()
    """driverMemory ... numExecutors, from the same settings as Livy's (unset: the pool's)."""
    server_timeout_s: float = 10.0
    """`SPARK_DOWNSTREAM_TIMEOUT_SECONDS`: how long Fabric may take to answer a create."""

    @classmethod
    def read(cls, r: SettingReader, url: str) -> FabricOptions:
        if "/workspaces/" in url.lower():
            r.problem(
                f"SPARK_URL is the Fabric API base ({FABRIC_API}) when SPARK_BACKEND=fabric; the "
                "workspace and lakehouse go in SPARK_FABRIC_WORKSPACE_ID and SPARK_FABRIC_LAKEHOUSE_ID"
            )
        ids: dict[str, str] = {}
        for name, required in (
            ("SPARK_FABRIC_WORKSPACE_ID", True),
            ("SPARK_FABRIC_LAKEHOUSE_ID", True),
            ("SPARK_FABRIC_ENVIRONMENT_ID", False),
        ):
            value = r.text(name, "")
            if not value and required:
                r.problem(f"{name} is required when SPARK_BACKEND=fabric")
            elif value and not _GUID.match(value):
                r.problem(f"{name}={value[:80]!r} is not a GUID")
            ids[name] = value
        auth = r.choice("SPARK_FABRIC_AUTH", "managed-identity", AUTH_MODES)
        tenant = r.text("SPARK_FABRIC_TENANT_ID", "")
        client = r.text("SPARK_FABRIC_CLIENT_ID", r.text("AZURE_CLIENT_ID", ""))
        secret, cert = r.secret("SPARK_FABRIC_CLIENT_SECRET"), r.text("SPARK_FABRIC_CERTIFICATE_PATH", "")
        if auth == "service-principal":
            if not (tenant and r.text("SPARK_FABRIC_CLIENT_ID", "")):
                r.problem(
                    "SPARK_FABRIC_AUTH=service-principal needs SPARK_FABRIC_TENANT_ID and SPARK_FABRIC_CLIENT_ID"
                )
            if bool(secret) == bool(cert):
                r.problem(
                    "SPARK_FABRIC_AUTH=service-principal needs one of SPARK_FABRIC_CLIENT_SECRET or "
                    "SPARK_FABRIC_CERTIFICATE_PATH"
                )
        version = r.text("SPARK_FABRIC_LIVY_API_VERSION", LIVY_API_VERSION)
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}(-preview)?", version):
            r.problem(f"SPARK_FABRIC_LIVY_API_VERSION={version[:40]!r} is not a date like {LIVY_API_VERSION}")
        return cls(
            workspace_id=ids["SPARK_FABRIC_WORKSPACE_ID"],
            lakehouse_id=ids["SPARK_FABRIC_LAKEHOUSE_ID"],
            api_version=version,
            auth=auth,
            scope=r.text("SPARK_FABRIC_SCOPE", FABRIC_SCOPE),
            tenant_id=tenant,
            client_id=client,
            client_secret=secret,
            certificate_path=cert,
            environment_id=ids["SPARK_FABRIC_ENVIRONMENT_ID"],
            sizes=batch_sizes(r),
            server_timeout_s=r.number("SPARK_DOWNSTREAM_TIMEOUT_SECONDS", 10.0, 0.1),
        )


def credential_for(opts: FabricOptions) -> TokenCredential:
    """The azure-identity credential of these settings (no network call is made here)."""
    import azure.identity as identity

    if opts.auth == "service-principal":
        if opts.certificate_path:
            return identity.CertificateCredential(
                opts.tenant_id, opts.client_id, certificate_path=opts.certificate_path
            )
        return identity.ClientSecretCredential(opts.tenant_id, opts.client_id, opts.client_secret)
    if opts.auth == "managed-identity":
        return identity.ManagedIdentityCredential(client_id=opts.client_id or None)
    return identity.DefaultAzureCredential()


def token_error(exc: Exception, auth: str) -> DownstreamUnavailable | PermanentError:
    """A failed token request, classified: the token service unreachable or busy is transient;
    an identity that is not there or is refused is a configuration problem (permanent)."""
    from azure.core.exceptions import ServiceRequestError, ServiceResponseError

    status = getattr(exc, "status_code", None)
    first = scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else "", limit=200)
    kind = exc.__class__.__name__
    if isinstance(exc, ServiceRequestError | ServiceResponseError) or (
        isinstance(status, int) and (status >= 500 or status == 429)
    ):
        return DownstreamUnavailable(f"fabric: cannot get an Entra token now ({kind}): {first}")
    return PermanentError(
        f"fabric: no Entra token for SPARK_FABRIC_AUTH={auth} ({kind}); check the identity and "
        f"the SPARK_FABRIC_* settings: {first}"
    )


class FabricBackend(RestBackend[FabricOptions]):
    """`SPARK_URL` is the Fabric REST API base; the lakehouse's Livy endpoint hangs off it."""

    name = "fabric"
    options_type = FabricOptions

    def setup(self, spark: SparkSettings) -> None:
        o = self.opts
        self.batches = (
            f"{spark.url.rstrip('/')}/workspaces/{o.workspace_id}/lakehouses/{o.lakehouse_id}"
            f"/livyApi/versions/{o.api_version}/batches"
        )
        self.sizes: dict[str, Any] = dict(o.sizes)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": "Bearer " + self.token(self.opts.scope), "Content-Type": "application/json"}

    def credential(self) -> TokenCredential:
        return credential_for(self.opts)

    def token(self, scope: str) -> str:
        from azure.core.exceptions import AzureError

        try:
            return super().token(scope)
        except AzureError as exc:  # azure-identity's errors, classified
            raise token_error(exc, self.opts.auth) from None

    def create_body(self, job: SparkJobRequest) -> dict[str, Any]:
        conf = dict(job.conf)
        if self.opts.environment_id:
            conf["spark.fabric.environmentDetails"] = json.dumps({"id": self.opts.environment_id})
        body: dict[str, Any] = {
            "name": job.name,
            "file": job.job_file,
            "args": list(job.args),
            "tags": job.tags,
            "conf": conf,
            **self.sizes,
        }
        if job.py_files:
            body["pyFiles"] = list(job.py_files)
        return body

    def submit(self, job: SparkJobRequest) -> Submission:
        started = self.clock()
        try:
            resp = self.http.request(
                "POST", self.batches, json=self.create_body(job), allow=(400, 409, CAPACITY_FULL)
            )
        except ReadTimedOut:
            return self.find(job) or Submission(self.name, None, job.name, started)
        if resp.status_code == CAPACITY_FULL:
            raise _capacity_full(resp.text, "POST")
        if resp.status_code in (400, 409):
            text = scrub(resp.text or "")
            if re.search(r"duplicate|already exists", text, re.IGNORECASE):
                found = self.find(job)  # our earlier, timed-out create went through
                if found is not None:
                    return found
            raise PermanentError(f"fabric: HTTP {resp.status_code} on POST /batches: {text}")
        body = _json(resp.text, resp.status_code)
        if not isinstance(body, dict) or not body.get("id"):
            raise PermanentError("fabric: the create answer has no batch id")
        return Submission(self.name, str(body["id"]), job.name, started)

    def status(self, submission_id: str) -> RunStatus:
        resp = self.http.request("GET", f"{self.batches}/{submission_id}", allow=(404, CAPACITY_FULL))
        if resp.status_code == CAPACITY_FULL:
            raise _capacity_full(resp.text, "GET")
        if resp.status_code == 404:
            return RunStatus("unknown", f"Fabric no longer knows batch {submission_id}", "404")
        body = _json(resp.text, resp.status_code)
        if not isinstance(body, dict):
            raise DownstreamUnavailable(
                f"fabric: batch answer is not a JSON object (HTTP {resp.status_code})"
            )
        status = fabric_status(body)
        if status.state == "failed":
            detail = failure_detail(body)
            if detail:
                return RunStatus(status.state, f"{status.message}: {detail}", status.raw_state)
        return status

    def cancel(self, submission_id: str) -> None:
        resp = self.http.request(
            "DELETE",
            f"{self.batches}/{submission_id}",
            allow=(404, CAPACITY_FULL),
            read_timeout_s=2 * self.http.read_timeout_s,
        )
        if resp.status_code == CAPACITY_FULL:
            raise _capacity_full(resp.text, "DELETE")

    def find(self, job: SparkJobRequest) -> Submission | None:
        """The newest batch named `job.name` (or tagged with its job id and submission)."""
        batches, total = self._page(0)
        if total > len(batches):
            batches += self._page(max(0, total - _PAGE))[0]
        newest = pick_newest([b for b in batches if is_ours(b, job)])
        return None if newest is None else Submission(self.name, str(newest["id"]), job.name, self.clock())

    def _page(self, start: int) -> tuple[list[dict[str, Any]], int]:
        resp = self.http.request(
            "GET", self.batches, params={"from": start, "size": _PAGE}, allow=(CAPACITY_FULL,)
        )
        if resp.status_code == CAPACITY_FULL:
            raise _capacity_full(resp.text, "GET")
        return batches_in(_json(resp.text, resp.status_code))


def batches_in(data: Any) -> tuple[list[dict[str, Any]], int]:
    """The batches of a list answer and how many there are in all. Livy's shape is
    `{from, total, sessions}`; a bare list, or `items` / `value`, are read alike."""
    total: int | None = None
    if isinstance(data, list):
        items: Any = data
    elif isinstance(data, dict):
        key = next((k for k in ("sessions", "items", "value") if k in data), None)
        if key is None:
            raise DownstreamUnavailable("fabric: the batch list has no sessions, items or value")
        items = data.get(key) or []
        if key == "sessions" and isinstance(data.get("total"), int):
            total = data["total"]  # Livy pages with from/size
    else:
        raise DownstreamUnavailable("fabric: the batch list is not JSON")
    if not isinstance(items, list):
        raise DownstreamUnavailable("fabric: the batch list is not a list")
    found = [b for b in items if isinstance(b, dict) and b.get("id")]
    return found, max(total or 0, len(found))


def pick_newest(batches: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last submitted of these (by `submittedAt` where given, else the list's order)."""
    if not batches:
        return None
    indexed = list(enumerate(batches))
    return max(indexed, key=lambda ib: (_submitted_at(ib[1]), ib[0]))[1]


def _submitted_at(batch: Mapping[str, Any]) -> str:
    info = batch.get("livyInfo")
    nested = info.get("submittedAt") if isinstance(info, Mapping) else None
    return str(batch.get("submittedAt") or nested or "")


def failure_detail(body: Mapping[str, Any]) -> str:
    """Why a batch failed: Fabric's error info, its cancellation reason, the driver log's tail."""
    parts: list[str] = []
    errors = body.get("errorInfo")
    for err in errors if isinstance(errors, list) else []:
        if isinstance(err, Mapping) and err.get("message"):
            code = f"[{err['errorCode']}] " if err.get("errorCode") else ""
            parts.append(f"{code}{err['message']}")
    state_info = body.get("fabricBatchStateInfo")
    if isinstance(state_info, Mapping) and state_info.get("errorMessage"):
        parts.append(str(state_info["errorMessage"]))
    if body.get("cancellationReason"):
        parts.append(f"cancelled: {body['cancellationReason']}")
    tail = log_tail(body.get("log"))
    if tail:
        parts.append(tail)
    unique = list(dict.fromkeys(p.strip() for p in parts if p.strip()))
    return scrub("; ".join(unique))


def _json(text: str, status: int) -> Any:
    try:
        return json.loads(text or "null")
    except ValueError:
        raise DownstreamUnavailable(f"fabric: answer is not JSON (HTTP {status})") from None


def _capacity_full(text: str, method: str) -> DownstreamUnavailable:
    return DownstreamUnavailable(
        f"fabric: capacity full (HTTP 430) on {method} /batches, try later: {scrub(text or '', limit=200)}"
    )
