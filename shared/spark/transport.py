"""The Spark backends' HTTP client: the app's one client (shared/net/client.py) under the names
the backends use, with the SPARK_* timeouts, Retry-After cap and credentials hint."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from shared.core.errors import PermanentError
from shared.net.client import (
    BudgetSpent,
    HttpClient,
    ReadTimedOut,
    json_body,
    remaining_budget,
    retry_after_seconds,
    scrub,
    step_budget,
)
from shared.spark.config import MAX_THROTTLE_RETRIES, BackendOptions, SparkSettings

__all__ = [
    "BudgetSpent",
    "HttpClient",
    "ReadTimedOut",
    "RestBackend",
    "TokenCredential",
    "client_for",
    "json_body",
    "own_options",
    "remaining_budget",
    "retry_after_seconds",
    "scrub",
    "step_budget",
]

OptionsT = TypeVar("OptionsT", bound=BackendOptions)
AUTH_HINT = "check the SPARK_* auth settings and the identity's role"


def own_options(spark: SparkSettings, kind: type[OptionsT], backend: str) -> OptionsT:
    """The backend's own settings; PermanentError when they were read for another backend."""
    if not isinstance(spark.options, kind):
        raise PermanentError(f"{backend}: settings were not read for SPARK_BACKEND={backend}")
    return spark.options


def client_for(
    backend: str,
    spark: SparkSettings,
    headers: Callable[[], Mapping[str, str]],
    auth: tuple[str, str] | None = None,
) -> HttpClient:
    """The backend's HTTP client, with the timeouts and Retry-After cap every backend shares."""
    return HttpClient(
        backend,
        spark.connect_timeout_s,
        spark.read_timeout_s,
        headers=headers,
        auth=auth,
        retry_after_max_s=spark.retry_after_max_s,
        max_throttle_retries=MAX_THROTTLE_RETRIES,
        auth_hint=AUTH_HINT,
    )


class TokenCredential(Protocol):
    """What azure-identity's credentials offer (`get_token(scope).token`)."""

    def get_token(self, *scopes: str) -> Any: ...


class RestBackend(Generic[OptionsT]):
    """What every backend is built from: its own settings (`opts`, refused when read for another
    backend), the clock, a bearer-token provider (azure-identity's credential, made on first use,
    unless one is given) and its HTTP client. A backend names itself and its options' type, keeps
    what its requests need in `setup`, and says its headers."""

    name: str
    options_type: type[OptionsT]

    def __init__(
        self,
        spark: SparkSettings,
        clock: Callable[[], float] = time.time,
        token_provider: Callable[[str], str] | None = None,
    ) -> None:
        self.opts: OptionsT = own_options(spark, self.options_type, self.name)
        self.clock = clock
        self._token_provider = token_provider
        self._token_lock = threading.Lock()
        self.setup(spark)
        self.http = client_for(self.name, spark, self._headers, self.basic_auth())

    def setup(self, spark: SparkSettings) -> None:
        """Keep what the backend's requests need (URLs, sizes) from `spark` and `self.opts`."""

    def basic_auth(self) -> tuple[str, str] | None:
        """(user, password) when the backend signs in with basic auth."""
        return None

    def _headers(self) -> dict[str, str]:
        return {}

    def credential(self) -> TokenCredential:
        """The azure-identity credential tokens come from (no network call is made here)."""
        from azure.identity import DefaultAzureCredential

        return DefaultAzureCredential()

    def token(self, scope: str) -> str:
        """A bearer token for `scope`, from the given provider or the backend's credential."""
        with self._token_lock:
            if self._token_provider is None:
                credential = self.credential()
                self._token_provider = lambda s: str(credential.get_token(s).token)
            provider = self._token_provider
        return provider(scope)
