"""The Spark backends' HTTP client: the app's one client (shared/net/client.py) under the names
the backends use, with the SPARK_* timeouts, Retry-After cap and credentials hint."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

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
