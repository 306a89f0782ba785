"""Storage clients from a connection string or an identity, and error-code helpers."""

from __future__ import annotations

import contextlib
import os
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import requests
import requests.adapters
from azure.core.credentials import TokenCredential
from azure.core.exceptions import AzureError
from azure.core.pipeline import PipelineRequest
from azure.storage.blob import BlobServiceClient, ContainerClient
from azure.storage.blob import ExponentialRetry as BlobExponentialRetry
from azure.storage.queue import ExponentialRetry as QueueExponentialRetry
from azure.storage.queue import QueueClient, QueueServiceClient, TextBase64EncodePolicy

from shared.config.settings import StorageConnection
from shared.storage.failures import GONE_MESSAGE_CODES, error_code, is_throttled, status_code

DEV_CONNECTION = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;"
)

_RETRY_KW: dict[str, Any] = {
    "retry_total": 3,
    "initial_backoff": 1,
    "increment_base": 1.5,
    "random_jitter_range": 1,
}
"""The SDK's retries of one call wait about 2.5 + 3.3 + 4.4 s (measured: 10 s for 4 requests that
each answered 503). Its default, 18 + 24 + 42 s, would outlast the 30-s claim lease: this way a
failure reaches the app's own recovery (read-back, release, a re-check message) while the claim
still holds, and a heartbeat's renewal is retried before the lease ends. Calls made inside
`bounded_calls` follow its `CallBudget` instead."""
_CLIENT_KW: dict[str, Any] = {"connection_timeout": 10, "read_timeout": 30}
POOL_SIZE = 64
"""HTTP connections kept per client: above the host's messages in flight (batchSize + newBatchThreshold)."""


NETRC_FILES = ("~/.netrc", "~/_netrc")


def needs_environment(environ: Mapping[str, str], netrc_files: Iterable[str] = NETRC_FILES) -> bool:
    """True when requests would find proxies or .netrc credentials in the environment."""
    if any(name.lower() == "netrc" or name.lower().endswith("_proxy") for name in environ):
        return True
    if urllib.request.getproxies():  # the system's settings too, on macOS and Windows
        return True
    return any(os.path.exists(os.path.expanduser(path)) for path in netrc_files)


def ca_bundle(environ: Mapping[str, str]) -> str | None:
    """The CA bundle requests would take from the environment (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE)."""
    return environ.get("REQUESTS_CA_BUNDLE") or environ.get("CURL_CA_BUNDLE") or None


def client_kwargs() -> dict[str, Any]:
    """Client options: timeouts, and the environment's CA bundle, passed once."""
    bundle = ca_bundle(os.environ)
    return {**_CLIENT_KW, "connection_verify": bundle} if bundle else dict(_CLIENT_KW)


@dataclass(frozen=True)
class CallBudget:
    """What one storage call may spend inside `bounded_calls`: `retries` after the first try,
    `backoff_s` between tries, and each try's connect and read timeouts."""

    retries: int
    backoff_s: float
    connect_s: float
    read_s: float

    @property
    def worst_s(self) -> float:
        """The longest one call can take: every try timing out."""
        return (self.retries + 1) * (self.connect_s + self.read_s) + self.retries * self.backoff_s


_BUDGET: ContextVar[CallBudget | None] = ContextVar("storage_call_budget", default=None)


@contextlib.contextmanager
def bounded_calls(budget: CallBudget) -> Iterator[None]:
    """The blob, queue and table calls made in this context (this thread, this request) follow
    `budget` instead of the clients' retries and timeouts (`_RETRY_KW`, `_CLIENT_KW`; the table
    clients of shared/storage/tables.py too). A per-call `connection_timeout` or `read_timeout`
    still wins. Inner contexts win over outer ones."""
    token = _BUDGET.set(budget)
    try:
        yield
    finally:
        _BUDGET.reset(token)


def within_budget(settings: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """A retry policy's settings for one call, cut to the current `CallBudget` (if any); its
    timeouts go in the call's transport `options`."""
    budget = _BUDGET.get()
    if budget is None:
        return settings
    for key in ("total", "connect", "read", "status"):
        settings[key] = budget.retries
    settings["budget"] = budget
    options.setdefault("connection_timeout", budget.connect_s)
    options.setdefault("read_timeout", budget.read_s)
    return settings


class _BlobRetry(BlobExponentialRetry):
    """The blob SDK's exponential retry, cut to the `CallBudget` of `bounded_calls`."""

    def configure_retries(self, request: PipelineRequest[Any]) -> dict[str, Any]:
        return within_budget(super().configure_retries(request), request.context.options)

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        budget = settings.get("budget")
        return budget.backoff_s if isinstance(budget, CallBudget) else super().get_backoff_time(settings)


class _QueueRetry(QueueExponentialRetry):
    """The queue SDK's exponential retry (its own copy of the class), cut the same way."""

    def configure_retries(self, request: PipelineRequest[Any]) -> dict[str, Any]:
        return within_budget(super().configure_retries(request), request.context.options)

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        budget = settings.get("budget")
        return budget.backoff_s if isinstance(budget, CallBudget) else super().get_backoff_time(settings)


def requests_session() -> requests.Session:
    """A session whose pool holds a connection for every invocation in flight (the default is 10).

    requests looks for proxies, a CA bundle and .netrc credentials in the environment on every
    request (`trust_env`): 5.5 -> 5.1 ms of the local host's CPU per message (bench). With no proxy
    and no .netrc configured the session skips that; the CA bundle goes in `client_kwargs`.
    """
    session = requests.Session()
    session.trust_env = needs_environment(os.environ, NETRC_FILES)
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=POOL_SIZE)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


@dataclass
class StorageClients:
    """The clients the app uses, built once per process and shared by invocations."""

    blob: BlobServiceClient
    queue_service: QueueServiceClient

    def container(self, name: str) -> ContainerClient:
        return self.blob.get_container_client(name)

    def queue(self, name: str) -> QueueClient:
        """A queue client that base64-encodes what it sends: `decode_message` reads it, and so
        would a host rolled back to messageEncoding: base64."""
        return self.queue_service.get_queue_client(name, message_encode_policy=TextBase64EncodePolicy())

    def raw_queue(self, name: str) -> QueueClient:
        """A queue client that sends and receives message text unchanged (for poison copies)."""
        return self.queue_service.get_queue_client(name)


def credential_for(conn: StorageConnection) -> TokenCredential:
    """The token credential the identity-based `AzureWebJobsStorage__*` settings name.

    - `credential=managedidentity`: that managed identity only (by `managedIdentityResourceId`, or
      `clientId`; neither: the system-assigned one), as the Functions host reads it; no other source
      of tokens is tried.
    - no `credential` (local development): a service principal with `tenantId`, `clientId` and
      `clientSecret`; otherwise the developer's identity (Azure CLI, VS Code, shared token cache, a
      managed identity with `clientId`), in the tenant `tenantId` when given.
    """
    from azure.identity import ClientSecretCredential, DefaultAzureCredential, ManagedIdentityCredential

    if conn.credential == "managedidentity":
        if conn.managed_identity_resource_id:
            return ManagedIdentityCredential(
                identity_config={"resource_id": conn.managed_identity_resource_id}
            )
        return ManagedIdentityCredential(client_id=conn.client_id)
    if conn.client_secret and conn.tenant_id and conn.client_id:
        return ClientSecretCredential(conn.tenant_id, conn.client_id, conn.client_secret)
    kwargs: dict[str, Any] = {}
    if conn.client_id:
        kwargs["managed_identity_client_id"] = conn.client_id
    if conn.tenant_id:
        kwargs.update(
            shared_cache_tenant_id=conn.tenant_id,
            visual_studio_code_tenant_id=conn.tenant_id,
            additionally_allowed_tenants=[conn.tenant_id],
        )
    return DefaultAzureCredential(**kwargs)


def clients_for(conn: StorageConnection) -> StorageClients:
    blob_kw = {**client_kwargs(), "retry_policy": _BlobRetry(**_RETRY_KW)}
    queue_kw = {**client_kwargs(), "retry_policy": _QueueRetry(**_RETRY_KW)}
    if conn.connection_string is not None:
        text = (
            DEV_CONNECTION
            if conn.connection_string == "UseDevelopmentStorage=true"
            else conn.connection_string
        )
        return StorageClients(
            blob=BlobServiceClient.from_connection_string(text, session=requests_session(), **blob_kw),
            queue_service=QueueServiceClient.from_connection_string(
                text, session=requests_session(), **queue_kw
            ),
        )
    credential = credential_for(conn)
    assert conn.blob_service_uri and conn.queue_service_uri  # guaranteed by settings validation
    return StorageClients(
        blob=BlobServiceClient(
            conn.blob_service_uri, credential=credential, session=requests_session(), **blob_kw
        ),
        queue_service=QueueServiceClient(
            conn.queue_service_uri, credential=credential, session=requests_session(), **queue_kw
        ),
    )


__all__ = [
    "GONE_MESSAGE_CODES",
    "AzureError",
    "CallBudget",
    "StorageClients",
    "bounded_calls",
    "clients_for",
    "credential_for",
    "error_code",
    "is_throttled",
    "status_code",
]
