"""shared.telemetry without any network: no connection string -> not configured; log context fields."""

from __future__ import annotations

import io
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shared import telemetry  # noqa: E402
from shared.telemetry import (  # noqa: E402
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
    with caplog.at_level(logging.WARNING, logger="shared.telemetry"):
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
