"""shared.observability.telemetry without any network: what the app exports next to the host, quiet SDK loggers, log context fields."""

from __future__ import annotations

import io
import logging
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shared.observability import telemetry  # noqa: E402
from shared.observability.telemetry import (  # noqa: E402
    MISSING,
    JobContextFilter,
    configure_telemetry,
    install_log_context,
    job_log_context,
    parse_authentication_string,
)


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(job_id)s %(queue_message_id)s %(message)s"))
    handler.addFilter(JobContextFilter())
    log = logging.getLogger(f"test.telemetry.{id(stream)}")
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    log.propagate = False
    yield log, stream
    log.removeHandler(handler)


@pytest.mark.parametrize("value", [None, "", "   "])
def test_not_configured_without_connection_string(value: str | None) -> None:
    assert configure_telemetry(value) is False


def test_missing_distro_is_a_warning_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(telemetry, "_configured", False)
    monkeypatch.setitem(sys.modules, "azure.monitor.opentelemetry", None)  # import fails
    with caplog.at_level(logging.WARNING, logger="shared.observability.telemetry"):
        ok = configure_telemetry("InstrumentationKey=00000000-0000-0000-0000-000000000000")
    assert ok is False
    assert "azure-monitor-opentelemetry is not installed" in caplog.text


def test_filter_adds_default_fields(captured: tuple[logging.Logger, io.StringIO]) -> None:
    log, stream = captured
    log.info("hello")
    assert stream.getvalue().strip() == f"{MISSING} {MISSING} hello"


def test_filter_keeps_explicit_values(captured: tuple[logging.Logger, io.StringIO]) -> None:
    log, stream = captured
    log.info("done", extra={"job_id": "j-1", "queue_message_id": "m-1"})
    assert stream.getvalue().strip() == "j-1 m-1 done"


def test_context_fills_fields_and_is_restored(captured: tuple[logging.Logger, io.StringIO]) -> None:
    log, stream = captured
    with job_log_context(job_id="j-2", queue_message_id="m-2"):
        log.info("inside")
        with job_log_context(job_id="j-3"):
            log.info("nested")
    log.info("outside")
    assert stream.getvalue().splitlines() == ["j-2 m-2 inside", "j-3 m-2 nested", "- - outside"]


def test_context_is_per_thread(captured: tuple[logging.Logger, io.StringIO]) -> None:
    log, stream = captured
    barrier = threading.Barrier(2)

    def work(n: int) -> None:
        with job_log_context(job_id=f"job-{n}", queue_message_id=f"msg-{n}"):
            barrier.wait()
            log.info("t%d", n)

    threads = [threading.Thread(target=work, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(stream.getvalue().splitlines()) == ["job-1 msg-1 t1", "job-2 msg-2 t2"]


def test_install_log_context_covers_records_of_child_loggers() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(job_id)s|%(queue_message_id)s|%(message)s"))
    parent = logging.getLogger(f"test.parent.{id(stream)}")
    parent.addHandler(handler)
    parent.propagate = False
    install_log_context(handlers=parent.handlers)
    child = logging.getLogger(f"{parent.name}.some.library")
    child.setLevel(logging.INFO)
    try:
        child.info("plain")
        with job_log_context(job_id="j-9", queue_message_id="m-9"):
            child.info("in job")
            child.info("explicit", extra={"job_id": "j-x"})
    finally:
        parent.removeHandler(handler)
    assert stream.getvalue().splitlines() == ["-|-|plain", "j-9|m-9|in job", "j-x|m-9|explicit"]


def test_install_log_context_adds_one_filter_per_handler() -> None:
    handler = logging.NullHandler()
    install_log_context(handlers=[handler])
    install_log_context(handlers=[handler])
    assert sum(isinstance(f, JobContextFilter) for f in handler.filters) == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("Authorization=AAD", ""),
        ("ClientId=abc-123;Authorization=AAD", "abc-123"),
        ("authorization=aad; clientid=abc", "abc"),
        ("ClientId=abc", None),
    ],
)
def test_parse_authentication_string(value: str | None, expected: str | None) -> None:
    assert parse_authentication_string(value) == expected


# ------------------------------------------------------------------ what the app exports, and what the host does


CONN = "InstrumentationKey=00000000-0000-0000-0000-000000000000;IngestionEndpoint=https://x.in.applicationinsights.azure.com/"
OTEL_ENV = {"PYTHON_ENABLE_OPENTELEMETRY": "true"}


@pytest.mark.parametrize(
    ("conn", "env", "in_worker", "host_mode", "export", "logs"),
    [
        (None, OTEL_ENV, True, "OpenTelemetry", False, False),
        ("  ", {}, False, "", False, False),
        # outside the Functions host nobody else sends anything
        (CONN, {}, False, "", True, True),
        (CONN, OTEL_ENV, False, "OpenTelemetry", True, True),
        # the deployed configuration: the worker streams its own logs, the host drops its copies
        (CONN, OTEL_ENV, True, "OpenTelemetry", True, True),
        (CONN, {"PYTHON_ENABLE_OPENTELEMETRY": "1"}, True, "openTelemetry", True, True),
        # the host forwards the worker's logs: exporting them too would send each one twice
        (CONN, {}, True, "OpenTelemetry", True, False),
        (CONN, OTEL_ENV, True, "", True, False),
        (CONN, OTEL_ENV, True, "ApplicationInsights", True, False),
        (CONN, {"PYTHON_ENABLE_OPENTELEMETRY": "false"}, True, "OpenTelemetry", True, False),
        # the worker configures the distro itself: a second configuration would export twice
        (
            CONN,
            {"PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY": "true", **OTEL_ENV},
            True,
            "OpenTelemetry",
            False,
            False,
        ),
    ],
)
def test_telemetry_plan(
    conn: str | None, env: dict[str, str], in_worker: bool, host_mode: str, export: bool, logs: bool
) -> None:
    plan = telemetry.telemetry_plan(conn, env, in_worker=in_worker, host_mode=host_mode)
    assert (plan.export, plan.logs) == (export, logs), plan.reason


def test_host_json_asks_for_opentelemetry(tmp_path: Path) -> None:
    assert telemetry.host_telemetry_mode(ROOT / "host.json") == "OpenTelemetry"
    assert telemetry.host_telemetry_mode(tmp_path / "missing.json") == ""
    (tmp_path / "host.json").write_text('{"version": "2.0"}')
    assert telemetry.host_telemetry_mode(tmp_path / "host.json") == ""
    (tmp_path / "host.json").write_text("not json")
    assert telemetry.host_telemetry_mode(tmp_path / "host.json") == ""


def test_only_the_functions_worker_counts_as_in_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in telemetry.WORKER_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert telemetry.in_functions_worker() is False
    monkeypatch.setitem(sys.modules, "azure_functions_worker", types.ModuleType("azure_functions_worker"))
    assert telemetry.in_functions_worker() is True


@pytest.fixture
def sdk_loggers() -> Iterator[None]:
    """Restore the levels, handlers and filters of the loggers these tests touch."""
    names = [*telemetry.AZURE_SDK_LOGGERS, "jobs", "test.telemetry.app"]
    saved = {n: (logging.getLogger(n).level, list(logging.getLogger(n).handlers)) for n in names}
    for name in telemetry.AZURE_SDK_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    yield
    for name, (level, handlers) in saved.items():
        lg = logging.getLogger(name)
        lg.setLevel(level)
        lg.handlers[:] = handlers


def test_azure_sdk_loggers_are_quieted(sdk_loggers: None) -> None:
    http = logging.getLogger("azure.core.pipeline.policies.http_logging_policy")
    assert http.isEnabledFor(logging.INFO) or logging.getLogger().level > logging.INFO
    changed = telemetry.quiet_azure_sdk_loggers()
    assert set(changed) == set(telemetry.AZURE_SDK_LOGGERS)
    assert not http.isEnabledFor(logging.INFO)  # each request's headers: not a user log any more
    assert http.isEnabledFor(logging.WARNING)
    assert not logging.getLogger("azure.storage.blob._shared.policies").isEnabledFor(logging.INFO)
    assert not logging.getLogger("azure.identity._credentials.managed_identity").isEnabledFor(logging.INFO)
    assert telemetry.quiet_azure_sdk_loggers() == [], "idempotent"


def test_an_explicit_azure_log_level_is_kept(sdk_loggers: None) -> None:
    logging.getLogger("azure").setLevel(logging.DEBUG)  # someone is investigating
    assert telemetry.quiet_azure_sdk_loggers() == []
    assert logging.getLogger("azure.core.pipeline.policies.http_logging_policy").isEnabledFor(logging.DEBUG)


def test_the_runtime_build_quiets_the_sdk_loggers(sdk_loggers: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.config.settings import Settings
    from shared.runtime import wiring

    monkeypatch.delenv("APPLICATIONINSIGHTS_CONNECTION_STRING", raising=False)
    settings = Settings.from_env({"AzureWebJobsStorage": "UseDevelopmentStorage=true"})
    wiring.build_runtime(settings, create_resources=False, handlers={})
    assert logging.getLogger("azure").level == logging.WARNING
    assert not logging.getLogger("azure.core.pipeline.policies.http_logging_policy").isEnabledFor(
        logging.INFO
    )


class _FakeDistro:
    """Stands in for azure.monitor.opentelemetry: records the call, adds a handler like the distro."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def module(self) -> types.ModuleType:
        module = types.ModuleType("azure.monitor.opentelemetry")
        module.configure_azure_monitor = self.configure  # type: ignore[attr-defined]
        return module

    def configure(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)
        if not kwargs.get("disable_logging"):
            handler = type("LoggingHandler", (logging.Handler,), {"emit": lambda self, record: None})()
            logging.getLogger(kwargs.get("logger_name") or None).addHandler(handler)


@pytest.fixture
def distro(monkeypatch: pytest.MonkeyPatch, sdk_loggers: None) -> _FakeDistro:
    fake = _FakeDistro()
    monkeypatch.setitem(sys.modules, "azure.monitor.opentelemetry", fake.module())
    monkeypatch.setattr(telemetry, "_configured", False)
    return fake


def _otel_handlers(name: str) -> list[logging.Handler]:
    return [h for h in logging.getLogger(name).handlers if type(h).__name__ == "LoggingHandler"]


def test_deployed_configuration_exports_logs_from_the_app(distro: _FakeDistro) -> None:
    env = {**OTEL_ENV, "APPLICATIONINSIGHTS_AUTHENTICATION_STRING": "ClientId=abc;Authorization=AAD"}
    assert telemetry.configure_telemetry(CONN, logger_name="test.telemetry.app", env=env, in_worker=True)
    [call] = distro.calls
    assert call["disable_logging"] is False
    assert call["logger_name"] == "test.telemetry.app"
    assert type(call["credential"]).__name__ == "ManagedIdentityCredential"
    [handler] = _otel_handlers("test.telemetry.app")
    assert handler in logging.getLogger("azure").handlers, "SDK warnings go the same way"
    assert any(isinstance(f, JobContextFilter) for f in handler.filters)
    exporter_record = logging.LogRecord(
        "azure.monitor.opentelemetry.exporter.x", logging.WARNING, "", 0, "", (), None
    )
    assert not handler.filter(exporter_record), "the exporter's own records are not exported"
    # a second call (another runtime build) configures nothing more
    assert telemetry.configure_telemetry(CONN, logger_name="test.telemetry.app", env=env, in_worker=True)
    assert len(distro.calls) == 1


def test_host_forwarded_logs_are_not_exported_again(distro: _FakeDistro) -> None:
    assert telemetry.configure_telemetry(CONN, logger_name="test.telemetry.app", env={}, in_worker=True)
    [call] = distro.calls
    assert call["disable_logging"] is True
    assert "credential" not in call
    assert _otel_handlers("test.telemetry.app") == []
    assert _otel_handlers("azure") == []


def test_worker_configured_distro_is_not_configured_twice(distro: _FakeDistro) -> None:
    env = {"PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY": "true"}
    assert (
        telemetry.configure_telemetry(CONN, logger_name="test.telemetry.app", env=env, in_worker=True)
        is False
    )
    assert distro.calls == []
    assert logging.getLogger("azure").level == logging.WARNING, "the SDK loggers are quieted all the same"


def test_an_otlp_endpoint_joins_the_distros_providers(
    distro: _FakeDistro, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36: with OTEL_EXPORTER_OTLP_ENDPOINT the distro gets an OTLP span processor and metric
    reader (its providers export to both); the local host's OTLP-only path: test_otlp_host.py."""
    monkeypatch.setattr(telemetry, "_otlp_configured", False)
    assert telemetry.configure_telemetry(
        CONN, logger_name="test.telemetry.app", env={}, in_worker=False, otlp_endpoint="http://127.0.0.1:4318"
    )
    [call] = distro.calls
    [processor] = call["span_processors"]
    [reader] = call["metric_readers"]
    try:
        assert type(processor).__name__ == "BatchSpanProcessor"
        assert processor.span_exporter._endpoint == "http://127.0.0.1:4318/v1/traces"
        assert type(reader).__name__ == "PeriodicExportingMetricReader"
        assert reader._exporter._endpoint == "http://127.0.0.1:4318/v1/metrics"
    finally:
        processor.shutdown()
    assert telemetry._otlp_configured


def test_the_otlp_endpoint_is_a_setting() -> None:
    from shared.config.settings import Settings
    from shared.core.errors import SettingsError

    base = {"AzureWebJobsStorage": "UseDevelopmentStorage=true"}
    assert Settings.from_env(base).otlp_endpoint == ""
    assert Settings.from_env(
        {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    ).otlp_endpoint == ("http://collector:4318")
    with pytest.raises(SettingsError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        Settings.from_env({**base, "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"})
