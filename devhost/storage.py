"""Storage connections (connection strings or identity) and storage request counting."""

from __future__ import annotations

import os
import threading
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
import requests.adapters
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.queue import ExponentialRetry, QueueClient, QueueServiceClient

from devhost.config import ConfigError

DEFAULT_CONNECTION = "AzureWebJobsStorage"
# Azurite's well-known development account (public and documented; not a secret).
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
DEV_BLOB_ENDPOINT = f"http://127.0.0.1:10000/{DEV_ACCOUNT}"
DEV_QUEUE_ENDPOINT = f"http://127.0.0.1:10001/{DEV_ACCOUNT}"

CLIENT_OPTIONS: dict[str, Any] = {
    # The storage SDK's default retry waits 15 s, 18 s, 24 s; Azure.Core's (used by the real host)
    # is 0.8 s exponential. Stay close to the latter so polling and renewals stay responsive.
    "retry_policy": ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=3),
    "connection_timeout": 5,
    "read_timeout": 30,
}


def _client_options() -> dict[str, Any]:
    """CLIENT_OPTIONS plus the environment's CA bundle, given once (see `_session`)."""
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    return {**CLIENT_OPTIONS, "connection_verify": bundle} if bundle else dict(CLIENT_OPTIONS)


def _session() -> requests.Session:
    """A pooled session sized for batchSize + newBatchThreshold in flight (requests' default is 10).

    It looks for proxies and .netrc in the environment per request only when some are configured
    (the lookup cost ~7% of the host's CPU per message); the app's shared/storage/clients.py does the
    same, and the devhost does not import the app's code.
    """
    session = requests.Session()
    session.trust_env = (
        any(name.lower() == "netrc" or name.lower().endswith("_proxy") for name in os.environ)
        or bool(urllib.request.getproxies())
        or any(os.path.exists(os.path.expanduser(f)) for f in ("~/.netrc", "~/_netrc"))
    )
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=64)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def expand_connection_string(value: str) -> str:
    """Map `UseDevelopmentStorage=true` to Azurite's standard endpoints and well-known key."""
    parts = dict(p.split("=", 1) for p in value.split(";") if "=" in p)
    if parts.get("UseDevelopmentStorage", "").lower() == "true":
        return (
            "DefaultEndpointsProtocol=http;"
            f"AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};"
            f"BlobEndpoint={DEV_BLOB_ENDPOINT};QueueEndpoint={DEV_QUEUE_ENDPOINT};"
        )
    return value


@dataclass(frozen=True)
class QueueConnection:
    """How to reach the queue service of one binding `connection`."""

    name: str
    connection_string: str | None = None
    service_uri: str | None = None
    client_id: str | None = None


def resolve_queue_connection(name: str | None, environ: Mapping[str, str]) -> QueueConnection:
    """Resolve a binding's `connection` like the host: NAME, then AzureWebJobsNAME; string or identity."""
    base = name or DEFAULT_CONNECTION
    candidates = [base] if base.startswith("AzureWebJobs") else [base, "AzureWebJobs" + base]
    for cand in candidates:
        value = environ.get(cand, "").strip()
        if value:
            return QueueConnection(cand, connection_string=expand_connection_string(value))
        uri = environ.get(f"{cand}__queueServiceUri", "").strip()
        account = environ.get(f"{cand}__accountName", "").strip()
        if uri or account:
            return QueueConnection(
                cand,
                service_uri=uri or f"https://{account}.queue.core.windows.net",
                client_id=environ.get(f"{cand}__clientId") or None,
            )
    raise ConfigError(
        f"storage connection {base!r} is not configured: set {base} to a connection string "
        f"(e.g. UseDevelopmentStorage=true), or {base}__queueServiceUri / {base}__accountName"
    )


class QueueClients:
    """One QueueServiceClient per connection (shared HTTP pool); raw clients, no encode/decode policy."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        self._services: dict[str, QueueServiceClient] = {}
        self._lock = threading.Lock()

    def service(self, connection: str | None) -> QueueServiceClient:
        conn = resolve_queue_connection(connection, self._environ)
        with self._lock:
            client = self._services.get(conn.name)
            if client is None:
                client = self._create(conn)
                self._services[conn.name] = client
            return client

    def queue(self, connection: str | None, queue_name: str) -> QueueClient:
        # message_encode_policy/message_decode_policy default to "none": raw text in, raw text out.
        return self.service(connection).get_queue_client(queue_name)

    @staticmethod
    def _create(conn: QueueConnection) -> QueueServiceClient:
        if conn.connection_string is not None:
            return QueueServiceClient.from_connection_string(
                conn.connection_string, session=_session(), **_client_options()
            )
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential(managed_identity_client_id=conn.client_id)
        assert conn.service_uri is not None
        return QueueServiceClient(
            conn.service_uri, credential=credential, session=_session(), **_client_options()
        )


# --- request counting ------------------------------------------------------------------------

_installed = False
_install_lock = threading.Lock()


def _endpoints_from_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """netloc -> 'blob'/'queue'/'table' for every storage endpoint named in a connection-string setting."""
    found: dict[str, str] = {}
    for value in environ.values():
        if "Endpoint" not in value and "UseDevelopmentStorage" not in value:
            continue
        parts = dict(p.split("=", 1) for p in expand_connection_string(value).split(";") if "=" in p)
        for key, service in (
            ("BlobEndpoint", "blob"),
            ("QueueEndpoint", "queue"),
            ("TableEndpoint", "table"),
        ):
            if parts.get(key):
                found[urlsplit(parts[key]).netloc.lower()] = service
    return found


class RequestCounter:
    """Counts storage HTTP requests made by any azure SDK client (sync RequestsTransport) in-process.

    The worker process counts its own (the app's) requests and sends them to the host with each
    result; the host adds them to its counter.
    """

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._endpoints = _endpoints_from_environ(environ)
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {}

    def classify(self, url: str) -> str:
        netloc = urlsplit(url).netloc.lower()
        if netloc in self._endpoints:
            return self._endpoints[netloc]
        host = netloc.split(":")[0]
        for service in ("blob", "queue", "table", "dfs"):
            if f".{service}." in host:
                return service
        return "other"

    def record(self, method: str, url: str) -> None:
        service = self.classify(url)
        with self._lock:
            per = self._counts.setdefault(service, {})
            per[method.upper()] = per.get(method.upper(), 0) + 1

    def take(self) -> dict[str, dict[str, int]]:
        """The counts so far, and start again from zero (the worker sends them to the host)."""
        with self._lock:
            counts, self._counts = self._counts, {}
        return counts

    def add(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        """Add counts taken in another process (the worker's requests, by service and method)."""
        with self._lock:
            for service, per_method in counts.items():
                per = self._counts.setdefault(service, {})
                for method, n in per_method.items():
                    per[method] = per.get(method, 0) + n

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            counts = {svc: dict(per) for svc, per in self._counts.items()}
        total = sum(sum(per.values()) for per in counts.values())
        return {"total": total, **{svc: {**per, "total": sum(per.values())} for svc, per in counts.items()}}

    def install(self) -> None:
        """Wrap RequestsTransport.send once for the whole process."""
        global _installed
        with _install_lock:
            if _installed:
                return
            original = RequestsTransport.send
            counter = self

            def send(self: RequestsTransport, request: Any, **kwargs: Any) -> Any:
                counter.record(str(request.method), str(request.url))
                return original(self, request, **kwargs)

            RequestsTransport.send = send
            _installed = True
