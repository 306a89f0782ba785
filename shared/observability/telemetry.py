"""Telemetry: Application Insights through OpenTelemetry, and log records that always carry job ids.

- `configure_telemetry(connection_string)` turns on the Azure Monitor OpenTelemetry distro when an
  Application Insights connection string is set, for what nobody else sends (`telemetry_plan`):
  * in the Functions host with host.json `"telemetryMode": "OpenTelemetry"` and the app setting
    `PYTHON_ENABLE_OPENTELEMETRY=true` (what infra/main.bicep deploys) the worker tells the host that
    it exports its own telemetry, so the host drops the worker's forwarded logs: the app exports its
    logs (logger `jobs`, and the `azure` SDK loggers' warnings), traces and metrics itself;
  * in the Functions host otherwise, the host forwards every log record of the worker: the app
    exports traces and metrics only, or every record would arrive twice;
  * with `PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY=true` the worker configures the distro
    itself: the app configures nothing (a second configuration would export everything twice);
  * outside the Functions host (the CLI, the local host, tests): everything.
  With `APPLICATIONINSIGHTS_AUTHENTICATION_STRING` (`ClientId=<id>;Authorization=AAD`, as
  infra/main.bicep sets it) the exporter authenticates with that managed identity, as the App
  Insights resource accepts Entra tokens only.
- With an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`, read by the settings), spans and metrics
  also go to that collector over OTLP/HTTP protobuf (`otlp_exporters`): next to Azure Monitor (its
  distro gets the OTLP span processor and metric reader), or alone (the app sets up the SDK's
  tracer and meter providers itself). Logs stay with Azure Monitor / the host.
- `quiet_azure_sdk_loggers()` sets the `azure` SDK loggers to WARNING (unless something configured
  them already): in the Python worker their per-request INFO records (every storage call's request
  and response headers) would reach the host as user logs; host.json's `Azure.Core` category only
  filters the .NET host's own logs.
- `JobContextFilter` / `install_log_context()` make every log record carry `job_id` and
  `queue_message_id` (default "-"), filled from `job_log_context(...)` while a job is processed, so
  structured logs (customDimensions in App Insights) always have both fields.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "AZURE_SDK_LOGGERS",
    "CONTEXT_FIELDS",
    "MISSING",
    "JobContextFilter",
    "TelemetryPlan",
    "configure_otlp",
    "configure_telemetry",
    "host_telemetry_mode",
    "in_functions_worker",
    "install_log_context",
    "job_log_context",
    "otlp_exporters",
    "parse_authentication_string",
    "quiet_azure_sdk_loggers",
    "telemetry_plan",
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
_otlp_configured = False
SERVICE_NAME = "jobs"
"""`service.name` of the app's telemetry unless `OTEL_SERVICE_NAME` says otherwise."""

HOST_JSON = Path(__file__).resolve().parents[2] / "host.json"
WORKER_MODULES = ("azure_functions_worker", "proxy_worker", "azure_functions_runtime")
"""Modules of the Functions Python worker (3.12 and earlier; 3.13 and later): imported only in it."""

AZURE_SDK_LOGGERS = (
    "azure",
    "azure.core.pipeline.policies.http_logging_policy",
    "azure.identity",
    "azure.monitor.opentelemetry.exporter",
)
"""The `azure` SDK loggers set to WARNING: the parent, and the children that log per request."""

EXPORTED_SDK_LOGGER = "azure"
"""Besides the app's logger, whose records (WARNING and above) the app exports itself."""


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


def quiet_azure_sdk_loggers(level: int = logging.WARNING) -> list[str]:
    """Set the Azure SDK loggers to `level` (WARNING); returns the names changed.

    Leaves them alone when the `azure` logger already has a level (someone configured it, e.g. to
    DEBUG while investigating) and never lowers a child that has its own level. Idempotent.
    """
    if logging.getLogger("azure").level != logging.NOTSET:
        return []
    changed = []
    for name in AZURE_SDK_LOGGERS:
        sdk_logger = logging.getLogger(name)
        if sdk_logger.level == logging.NOTSET:
            sdk_logger.setLevel(level)
            changed.append(name)
    return changed


def in_functions_worker() -> bool:
    """True inside the Azure Functions Python worker (the real host or Core Tools)."""
    return any(name in sys.modules for name in WORKER_MODULES)


def host_telemetry_mode(host_json: Path = HOST_JSON) -> str:
    """host.json `telemetryMode` ("" when absent or unreadable; the host then uses Application Insights)."""
    try:
        data = json.loads(host_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    value = data.get("telemetryMode", "") if isinstance(data, dict) else ""
    return value if isinstance(value, str) else ""


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class TelemetryPlan:
    """What this process exports to Application Insights itself."""

    export: bool
    """Whether the app configures the Azure Monitor distro."""
    logs: bool
    """Whether the distro exports log records (False: the host forwards them, or nobody exports)."""
    reason: str


def telemetry_plan(
    connection_string: str | None, env: Mapping[str, str], *, in_worker: bool, host_mode: str
) -> TelemetryPlan:
    """Decide what the app exports so that nothing arrives twice (see the module docstring)."""
    if not connection_string or not connection_string.strip():
        return TelemetryPlan(False, False, "no APPLICATIONINSIGHTS_CONNECTION_STRING: telemetry stays local")
    if not in_worker:
        return TelemetryPlan(
            True, True, "outside the Functions host: the app exports logs, traces and metrics"
        )
    if _is_true(env.get("PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY")):
        return TelemetryPlan(
            False,
            False,
            "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY: the Python worker configures Azure Monitor itself",
        )
    if _is_true(env.get("PYTHON_ENABLE_OPENTELEMETRY")) and host_mode.strip().lower() == "opentelemetry":
        return TelemetryPlan(
            True,
            True,
            "host telemetryMode OpenTelemetry with PYTHON_ENABLE_OPENTELEMETRY: the host drops the "
            "worker's forwarded logs, the app exports its logs, traces and metrics",
        )
    return TelemetryPlan(
        True,
        False,
        "the host forwards the worker's log records: the app exports traces and metrics only "
        "(set host.json telemetryMode OpenTelemetry and PYTHON_ENABLE_OPENTELEMETRY=true to export logs from the app)",
    )


class _NotFromTheExporter(logging.Filter):
    """Drops the exporter's own records (a failed export must not queue more exports)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith("azure.monitor.opentelemetry")


def _share_log_handlers(source: str, target: str) -> None:
    """Attach the OpenTelemetry log handlers of logger `source` to logger `target` as well."""
    target_logger = logging.getLogger(target)
    for handler in logging.getLogger(source or None).handlers:
        if type(handler).__name__ == "LoggingHandler" and handler not in target_logger.handlers:
            if not any(isinstance(f, _NotFromTheExporter) for f in handler.filters):
                handler.addFilter(_NotFromTheExporter())
            target_logger.addHandler(handler)


def configure_telemetry(
    connection_string: str | None,
    *,
    authentication_string: str | None = None,
    logger_name: str = "",
    env: Mapping[str, str] | None = None,
    in_worker: bool | None = None,
    host_json: Path = HOST_JSON,
    otlp_endpoint: str = "",
) -> bool:
    """Export to Application Insights what nobody else sends (`telemetry_plan`); quiet the SDK loggers.

    Returns True when the Azure Monitor distro was configured by the app (now or by an earlier
    call), False when there is no connection string, when the worker configures the distro itself,
    or when `azure-monitor-opentelemetry` is not installed (a warning says so; the app keeps
    running with the host's logging only). `authentication_string` defaults to the
    `APPLICATIONINSIGHTS_AUTHENTICATION_STRING` setting; `env`, `in_worker` and `host_json` default
    to this process's. Always installs the log context fields and quiets the Azure SDK loggers.
    """
    global _configured
    quiet_azure_sdk_loggers()
    install_log_context()
    environ = os.environ if env is None else env
    plan = telemetry_plan(
        connection_string,
        environ,
        in_worker=in_functions_worker() if in_worker is None else in_worker,
        host_mode=host_telemetry_mode(host_json),
    )
    if not plan.export:
        if connection_string and connection_string.strip():
            logger.info("telemetry: %s", plan.reason)
        configure_otlp(otlp_endpoint, environ)
        return False
    assert connection_string is not None
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
        kwargs: dict[str, Any] = {
            "connection_string": connection_string.strip(),
            "logger_name": logger_name,
            "disable_logging": not plan.logs,
        }
        if otlp_endpoint:  # the distro's providers export to the collector too
            span_processor, metric_reader = otlp_exporters(otlp_endpoint)
            kwargs["span_processors"] = [span_processor]
            kwargs["metric_readers"] = [metric_reader]
        if authentication_string is None:
            authentication_string = environ.get("APPLICATIONINSIGHTS_AUTHENTICATION_STRING")
        client_id = parse_authentication_string(authentication_string)
        if client_id is not None:
            from azure.identity import ManagedIdentityCredential

            kwargs["credential"] = (
                ManagedIdentityCredential(client_id=client_id) if client_id else ManagedIdentityCredential()
            )
        configure_azure_monitor(**kwargs)
        _configured = True
        if otlp_endpoint:
            global _otlp_configured
            _otlp_configured = True
            logger.info("telemetry: spans and metrics also exported over OTLP to %s", otlp_endpoint)
    logger.info("telemetry: %s", plan.reason)
    if plan.logs and logger_name:
        # The SDK loggers sit outside `logger_name`; their warnings (retries, authentication
        # failures) reach Application Insights through the same handler.
        _share_log_handlers(logger_name, EXPORTED_SDK_LOGGER)
    # The distro adds its handler to the logger; make sure that handler sees the fields too.
    install_log_context(logging.getLogger(logger_name or None).handlers)
    return True


def otlp_exporters(endpoint: str) -> tuple[Any, Any]:
    """A batch span processor and a periodic metric reader exporting over OTLP/HTTP protobuf to
    `endpoint` (`/v1/traces`, `/v1/metrics`). The exporters read `OTEL_EXPORTER_OTLP_HEADERS` and
    the batch and interval settings (`OTEL_BSP_*`, `OTEL_METRIC_EXPORT_INTERVAL`) themselves."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    base = endpoint.rstrip("/")
    return (
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces")),
        PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{base}/v1/metrics")),
    )


def configure_otlp(endpoint: str, env: Mapping[str, str] | None = None) -> bool:
    """Without Azure Monitor: the SDK's tracer and meter providers, exporting over OTLP to
    `endpoint`. Returns True when OTLP export is on (now or before); False without an endpoint,
    or when the OTLP exporter is not installed (a warning says so). When another component set a
    tracer provider already (the Python worker's own Azure Monitor), the span processor joins it
    and metrics stay with that component."""
    global _otlp_configured
    if not endpoint:
        return False
    environ = os.environ if env is None else env
    with _lock:
        if _otlp_configured:
            return True
        try:
            span_processor, metric_reader = otlp_exporters(endpoint)
        except ImportError:
            logger.warning(
                "OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-exporter-otlp-proto-http is not "
                "installed: add it to requirements.txt to export over OTLP"
            )
            return False
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        resource = Resource.create({} if environ.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE_NAME})
        existing = trace.get_tracer_provider()
        if isinstance(existing, TracerProvider):
            existing.add_span_processor(span_processor)
        else:
            provider = TracerProvider(resource=resource)
            provider.add_span_processor(span_processor)
            trace.set_tracer_provider(provider)
        if not isinstance(metrics.get_meter_provider(), MeterProvider):
            metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[metric_reader]))
        _otlp_configured = True
    logger.info("telemetry: spans and metrics exported over OTLP to %s", endpoint)
    return True
