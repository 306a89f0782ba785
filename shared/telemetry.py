"""Telemetry: Application Insights through OpenTelemetry, and log records that always carry job ids.

- `configure_telemetry(connection_string)` turns on the Azure Monitor OpenTelemetry distro when an
  Application Insights connection string is set. With `APPLICATIONINSIGHTS_AUTHENTICATION_STRING`
  (`ClientId=<id>;Authorization=AAD`, as infra/main.bicep sets it) the exporter authenticates with
  that managed identity, as the App Insights resource accepts Entra tokens only.
- `JobContextFilter` / `install_log_context()` make every log record carry `job_id` and
  `queue_message_id` (default "-"), filled from `job_log_context(...)` while a job is processed, so
  structured logs (customDimensions in App Insights) always have both fields.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "CONTEXT_FIELDS",
    "MISSING",
    "JobContextFilter",
    "configure_telemetry",
    "install_log_context",
    "job_log_context",
    "parse_authentication_string",
]

logger = logging.getLogger(__name__)

MISSING = "-"
"""Value of a context field when the record was not logged while handling a job."""

CONTEXT_FIELDS = ("job_id", "queue_message_id")
"""Attributes every log record carries after `install_log_context()`."""

_job_id: contextvars.ContextVar[str] = contextvars.ContextVar("job_id", default=MISSING)
_queue_message_id: contextvars.ContextVar[str] = contextvars.ContextVar("queue_message_id", default=MISSING)
_VARS: dict[str, contextvars.ContextVar[str]] = {"job_id": _job_id, "queue_message_id": _queue_message_id}

_lock = threading.Lock()
_configured = False


@contextmanager
def job_log_context(job_id: str | None = None, queue_message_id: str | None = None) -> Iterator[None]:
    """Within this block, records without their own `job_id`/`queue_message_id` get these values.

    Context variables follow the current thread / asyncio task, so concurrent invocations do not mix.
    """
    tokens = []
    for name, value in (("job_id", job_id), ("queue_message_id", queue_message_id)):
        if value is not None:
            tokens.append((_VARS[name], _VARS[name].set(str(value))))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def _fill(record: logging.LogRecord) -> None:
    for name in CONTEXT_FIELDS:
        current = getattr(record, name, None)
        if current is None or current == "":
            setattr(record, name, _VARS[name].get())


class JobContextFilter(logging.Filter):
    """Adds `job_id` and `queue_message_id` to each record (explicit `extra=` values win).

    Never drops a record. Attach it to a handler (a logger's own filters do not see records that
    propagate from child loggers); `install_log_context()` does that for every record at once.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        _fill(record)
        return True


def install_log_context(handlers: list[logging.Handler] | None = None) -> None:
    """Add `JobContextFilter` to the given handlers (default: the root logger's). Idempotent.

    Records of every logger propagate to the root handlers (the Functions worker's, and the
    OpenTelemetry one `configure_telemetry` adds), so this covers all records they emit. A record
    factory is deliberately not used: it would make `extra={"job_id": ...}` raise KeyError.
    """
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        if not any(isinstance(f, JobContextFilter) for f in handler.filters):
            handler.addFilter(JobContextFilter())


def parse_authentication_string(value: str | None) -> str | None:
    """The managed identity client id of `ClientId=<id>;Authorization=AAD`, "" for the system-assigned
    identity (`Authorization=AAD` alone), None when Entra authentication is not requested."""
    if not value:
        return None
    parts: dict[str, str] = {}
    for item in value.split(";"):
        key, sep, val = item.partition("=")
        if sep:
            parts[key.strip().lower()] = val.strip()
    if parts.get("authorization", "").upper() != "AAD":
        return None
    return parts.get("clientid", "")


def configure_telemetry(
    connection_string: str | None,
    *,
    authentication_string: str | None = None,
    logger_name: str = "",
) -> bool:
    """Send logs, traces and metrics to Application Insights when a connection string is set.

    Returns True when the Azure Monitor distro was configured (now or by an earlier call), False when
    there is no connection string or `azure-monitor-opentelemetry` is not installed (a warning says
    so; the app keeps running with the host's logging only). `authentication_string` defaults to the
    `APPLICATIONINSIGHTS_AUTHENTICATION_STRING` setting. Always installs the log context fields.
    """
    global _configured
    install_log_context()
    if not connection_string or not connection_string.strip():
        return False
    with _lock:
        if _configured:
            return True
        try:
            from azure.monitor.opentelemetry import configure_azure_monitor
        except ImportError:
            logger.warning(
                "APPLICATIONINSIGHTS_CONNECTION_STRING is set but azure-monitor-opentelemetry is not "
                "installed: add it to requirements.txt to export telemetry to Application Insights"
            )
            return False
        kwargs: dict[str, Any] = {"connection_string": connection_string.strip(), "logger_name": logger_name}
        if authentication_string is None:
            authentication_string = os.environ.get("APPLICATIONINSIGHTS_AUTHENTICATION_STRING")
        client_id = parse_authentication_string(authentication_string)
        if client_id is not None:
            from azure.identity import ManagedIdentityCredential

            kwargs["credential"] = (
                ManagedIdentityCredential(client_id=client_id) if client_id else ManagedIdentityCredential()
            )
        configure_azure_monitor(**kwargs)
        _configured = True
    # The distro adds its handler to the logger; make sure that handler sees the fields too.
    install_log_context(logging.getLogger(logger_name or None).handlers)
    return True
