"""A kind's outbound policy: where its calls may go and where each of its secrets may be sent.

Settings, under the kind's prefix (`HTTP_` for the `http` kind):
- `<PREFIX>ALLOWED_HOSTS`: destinations (`host` or `host:port`; a host without a port allows the
  default port of the scheme only) let through the outbound guard (shared/net/guard.py);
- `<PREFIX>SECRET_<NAME>`: a secret value (a Key Vault reference in Azure), read at call time;
- `<PREFIX>SECRET_<NAME>_HOSTS`: the destinations that secret may be sent to (required: a secret
  without destinations refuses to start, naming it).

`OutboundPolicy` is a value: a caller holding another set of settings (e.g. a queue's own) reads
one with `read_outbound` and passes it where the kind's default one would go.
The app's own storage endpoints (`storage_endpoints`) are registered with the guard at start-up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.config.settings import Settings, StorageConnection
from shared.core.setting_reader import SettingReader
from shared.net.destinations import AllowList, BadUrl, Destination
from shared.net.endpoints import APP_ENDPOINTS, DEFAULT_SUFFIX, account_endpoints
from shared.net.guard import Guard, Resolver, resolve

HOSTS_SUFFIX = "_HOSTS"
_SECRET_NAME = re.compile(r"^[A-Z0-9_]+$")


def secret_setting(prefix: str, name: str) -> str:
    """The setting a secret `name` of a kind names: `PARTNER` or `<PREFIX>SECRET_PARTNER`."""
    full = f"{prefix}SECRET_"
    return name if name.startswith(full) else full + name


def is_secret_setting(prefix: str, key: str) -> bool:
    """`<PREFIX>SECRET_<NAME>` (upper case), not its `_HOSTS`."""
    head = f"{prefix}SECRET_"
    rest = key[len(head) :]
    return key.startswith(head) and bool(_SECRET_NAME.match(rest)) and not key.endswith(HOSTS_SUFFIX)


@dataclass(frozen=True)
class OutboundPolicy:
    """Where a kind's calls may go (`allowed`) and where each secret setting may be sent."""

    prefix: str = "HTTP_"
    allowed: AllowList = field(default_factory=AllowList)
    secrets: Mapping[str, AllowList] = field(default_factory=dict)
    """Each configured secret setting's destinations (`<NAME>_HOSTS`)."""

    @property
    def allowed_setting(self) -> str:
        return f"{self.prefix}ALLOWED_HOSTS"

    def guard(self, resolver: Resolver = resolve) -> Guard:
        return Guard(self.allowed, frozenset(), resolver, self.allowed_setting)

    def secret_refusal(self, setting: str, dest: Destination) -> str | None:
        """Why `setting` may not be sent to `dest` (None: it may)."""
        hosts = self.secrets.get(setting)
        if not hosts:
            return f"secret {setting} has no destinations ({setting}{HOSTS_SUFFIX} is not set)"
        if not hosts.allows(dest):
            return f"secret {setting} may be sent only to {setting}{HOSTS_SUFFIX} ({hosts}); not to {dest}"
        return None


def read_allow_list(reader: SettingReader, name: str) -> AllowList:
    try:
        return AllowList.parse(reader.text(name, ""))
    except BadUrl as bad:
        reader.problem(f"{name}: {bad}")
        return AllowList()


def read_outbound(reader: SettingReader, prefix: str) -> OutboundPolicy:
    """A kind's policy from its settings; a bad entry or a secret without destinations is a
    problem naming the setting (never its value)."""
    return OutboundPolicy(
        prefix, read_allow_list(reader, f"{prefix}ALLOWED_HOSTS"), read_secrets(reader, prefix)
    )


def read_secrets(reader: SettingReader, prefix: str) -> dict[str, AllowList]:
    """Each `<prefix>SECRET_<NAME>` set (found by listing the settings: secrets are named by a
    pattern) with its destinations; one without them is a problem naming it."""
    secrets: dict[str, AllowList] = {}
    named = {k for k in reader.env if is_secret_setting(prefix, k) and reader.secret(k)}
    named |= {k[: -len(HOSTS_SUFFIX)] for k in reader.env if k.endswith(HOSTS_SUFFIX)}
    for key in sorted(k for k in named if is_secret_setting(prefix, k)):
        hosts = read_allow_list(reader, key + HOSTS_SUFFIX)
        if not hosts and reader.secret(key):
            reader.problem(
                f"{key} has no destinations: set {key}{HOSTS_SUFFIX} to the hosts (host or host:port, "
                f"comma-separated) it may be sent to"
            )
        secrets[key] = hosts
    return secrets


def secret_destinations(source: Mapping[str, str], setting: str) -> AllowList:
    """A secret's destinations as set now (empty when unset or bad: nothing allowed)."""
    try:
        return AllowList.parse(source.get(setting + HOSTS_SUFFIX, ""))
    except BadUrl:
        return AllowList()


def storage_endpoints(conn: StorageConnection) -> tuple[str, ...]:
    """The hosts of a storage connection's endpoints: explicit ones and every service of its account."""
    hosts: list[str] = []
    uris = [conn.blob_service_uri, conn.queue_service_uri, conn.table_endpoint()]
    text = conn.connection_string or ""
    uris += [value for _key, value in re.findall(r"(\w+Endpoint)=([^;]+)", text)]
    for uri in uris:
        found = re.match(r"^\w+://([^/:]+)", uri or "")
        if not found:
            continue
        hosts.append(found.group(1))
        parts = found.group(1).split(".")
        if len(parts) > 3 and parts[1] in ("blob", "queue", "table", "file", "dfs"):
            hosts.extend(account_endpoints(parts[0], ".".join(parts[2:])))
    if conn.account_name:
        hosts.extend(account_endpoints(conn.account_name))
    account = re.search(r"AccountName=([^;]+)", text)
    suffix = re.search(r"EndpointSuffix=([^;]+)", text)
    if account:
        hosts.extend(account_endpoints(account.group(1), suffix.group(1) if suffix else DEFAULT_SUFFIX))
    return tuple(dict.fromkeys(h.lower() for h in hosts))


def connection_endpoints(source: Mapping[str, str], name: str) -> tuple[str, ...]:
    """The hosts of a named connection setting (a connection string, or its identity-based
    `<name>__accountName` / `__blobServiceUri` / `__queueServiceUri` / `__tableServiceUri` / `__serviceUri`)."""
    uris = [
        source.get(f"{name}__{part}", "") for part in ("blobServiceUri", "queueServiceUri", "tableServiceUri")
    ]
    conn = StorageConnection(
        connection_string=source.get(name, "").strip() or None,
        blob_service_uri=uris[0] or source.get(f"{name}__serviceUri", "") or None,
        queue_service_uri=uris[1] or None,
    )
    hosts = list(storage_endpoints(conn))
    hosts += [h for uri in uris[2:] if (h := _host(uri))]
    account = source.get(f"{name}__accountName", "").strip()
    if account:
        hosts += account_endpoints(account)
    return tuple(dict.fromkeys(h.lower() for h in hosts))


def _host(uri: str) -> str:
    found = re.match(r"^\w+://([^/:]+)", uri or "")
    return found.group(1) if found else ""


def register_app_endpoints(settings: Settings) -> None:
    """Every kind's guard refuses these from now on (shared/net/endpoints.py): the endpoints of
    `AzureWebJobsStorage` and of each queue's own connection (`QUEUE_<NAME>_CONNECTION`)."""
    APP_ENDPOINTS.add(storage_endpoints(settings.storage))
    for queue in settings.queue_set.queues:
        if queue.connection:
            APP_ENDPOINTS.add(connection_endpoints(settings.source, queue.connection))
