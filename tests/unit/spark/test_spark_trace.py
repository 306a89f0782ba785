"""Issue 36: a Spark run receives the job's trace context, the driver's log records carry it, and
the Spark HTTP client propagates `traceparent`."""

from __future__ import annotations

import io
import logging
from typing import Any, cast

from opentelemetry import trace

from shared.config.settings import Settings
from shared.jobs.offload.aggregate_spark import build_request
from shared.net.client import HttpClient
from spark_jobs import aggregate_job
from tests.handlerkit import Receiver
from tests.otel_support import memory_telemetry
from tests.spark.helpers import PAYLOAD, make_ctx

LIVY = {
    "AzureWebJobsStorage__accountName": "prodacct",
    "SPARK_BACKEND": "livy",
    "SPARK_URL": "https://ws/livy",
    "SPARK_JOB_FILE": "abfss://jobs@prodacct.dfs.core.windows.net/aggregate_job.py",
}


def test_the_run_gets_the_handler_spans_traceparent() -> None:
    memory_telemetry()
    ctx = make_ctx(Settings.from_env(LIVY), cast(Any, None), PAYLOAD)
    assert "--traceparent" not in build_request(ctx, 1).args  # no span: no argument
    with trace.get_tracer("test").start_as_current_span("job handler") as span:
        args = list(build_request(ctx, 1).args)
        context = span.get_span_context()
    traceparent = args[args.index("--traceparent") + 1]
    assert traceparent.startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
    assert aggregate_job.parse_args(args).traceparent == traceparent


def test_the_drivers_log_records_carry_the_trace_id() -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    log = aggregate_job.driver_log("job-1", traceparent)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter(aggregate_job.LOG_FORMAT))
    log.logger.addHandler(handler)
    try:
        log.info("started (submission %s)", 1)
    finally:
        log.logger.removeHandler(handler)
    assert (
        "job_id=job-1 trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7 started"
        in out.getvalue()
    )
    assert aggregate_job.trace_fields("j", "garbage") == {"job_id": "j", "trace_id": "-", "span_id": "-"}


def test_outbound_requests_carry_the_current_traceparent() -> None:
    """The app's one HTTP client (Spark backends and handlers alike) sends the current span's
    traceparent, and nothing when no span is current; its own headers stay as they were."""
    memory_telemetry()
    server = Receiver()
    try:
        client = HttpClient("test", 2.0, 5.0, headers=lambda: {"Authorization": "Bearer x"})
        client.request("GET", server.url("/no-span"))
        with trace.get_tracer("test").start_as_current_span("job handler") as span:
            client.request("POST", server.url("/in-span"), json={})
    finally:
        server.stop()
    outside, inside = server.requests
    assert "traceparent" not in {k.lower() for k in outside.headers}
    sent = {k.lower(): v for k, v in inside.headers.items()}
    assert sent["traceparent"].split("-")[1] == f"{span.get_span_context().trace_id:032x}"
    assert sent["authorization"] == "Bearer x"
