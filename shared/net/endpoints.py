"""The app's own storage endpoints: one definition, refused by every kind's outbound guard.

Every storage connection the app holds adds its endpoints here at start-up (`APP_ENDPOINTS.add`,
called by `shared.jobs.kinds.configure_kinds` for the app's connection; a component that opens
another connection adds its own). A host is one of them when, after its canonical form
(lower case, no trailing dot, IDNA), dropping a `privatelink` label and the `-secondary` suffix of
the account label gives a known endpoint: `myacct.blob.core.windows.net`,
`MyAcct-secondary.blob.core.windows.net.`, `myacct.privatelink.dfs.core.windows.net` are all the
app's own. The guard also compares resolved addresses (shared/net/guard.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from shared.net.destinations import BadUrl, canonical_host

SERVICES = ("blob", "queue", "table", "file", "dfs", "web")
DEFAULT_SUFFIX = "core.windows.net"


def account_endpoints(account: str, suffix: str = DEFAULT_SUFFIX) -> list[str]:
    """The service endpoints of a storage account (pure)."""
    return [f"{account}.{service}.{suffix}" for service in SERVICES]


def base_name(host: str) -> str:
    """A canonical host with any `privatelink` label and the account's `-secondary` dropped."""
    labels = [label for label in host.split(".") if label != "privatelink"]
    if labels and labels[0].endswith("-secondary"):
        labels[0] = labels[0][: -len("-secondary")]
    return ".".join(labels)


class AppEndpoints:
    """The storage endpoints of every connection the app has (names; thread-safe, only grows)."""

    def __init__(self) -> None:
        self._names: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def add(self, hosts: Iterable[str]) -> None:
        names = set()
        for host in hosts:
            try:
                names.add(base_name(canonical_host(host)))
            except BadUrl:
                continue
        with self._lock:
            self._names = self._names | names

    def names(self) -> frozenset[str]:
        return self._names

    def owns(self, host: str, extra: Iterable[str] = ()) -> bool:
        """Whether a canonical host is one of the app's endpoints (or of `extra`)."""
        base = base_name(host)
        return base in self._names or base in {base_name(h) for h in extra}


APP_ENDPOINTS = AppEndpoints()
"""The process's own endpoints (the app's storage account and any other connection it opens)."""
