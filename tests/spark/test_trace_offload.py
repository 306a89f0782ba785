"""Issue 36: a Spark-offloaded job's submission and its polls share the job's trace, through the
processor, against the Livy fake (real HTTP on loopback, results on a real Azurite)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from devstack.azurite import Azurite
from shared import ledger
from shared.core.envelope import Envelope
from shared.jobs import aggregate
from shared.runtime.wiring import build_runtime
from tests.integration.helpers import settings_for as app_settings_for
from tests.otel_support import memory_telemetry, spans_of
from tests.spark.fakes import FakeLivy
from tests.spark.helpers import PAYLOAD, storage_for, unique, upload
from tests.spark.test_outages import _continuation, _process, livy_env

pytestmark = pytest.mark.integration
TRACE_ID = "5bf92f3577b34da6a3ce929d0e0e4737"
TRACEPARENT = f"00-{TRACE_ID}-10f067aa0ba902b7-01"


def test_submission_and_polls_of_an_offloaded_job_are_in_its_trace(azurite: Azurite) -> None:
    exporter, _ = memory_telemetry()
    exporter.clear()
    server = FakeLivy(auth="basic")
    try:
        settings = app_settings_for(azurite, **livy_env(server))
        rt = build_runtime(settings, handlers={"aggregate": aggregate.HANDLER})
        upload(storage_for(settings), "data", "in.csv", b"k\na\na\n")
        env = Envelope(
            id=unique("job-"),
            kind="aggregate",
            created_at=datetime.now(UTC),
            payload=PAYLOAD,
            traceparent=TRACEPARENT,
        )
        _process(rt, env)
        assert rt.ledger.get(env.id).data["status"] == ledger.OFFLOADED  # type: ignore[union-attr]
        _process(rt, _continuation(rt, env))  # the first poll: the run is still pending
        [submit] = [r for r in server.requests if r.method == "POST" and r.path == "/batches"]
        polls = [r for r in server.requests if r.method == "GET" and r.path.startswith("/batches/")]
        assert polls, server.requests
        for request in [submit, *polls]:
            assert request.headers["traceparent"].split("-")[1] == TRACE_ID, request
        args = submit.body["args"]
        assert args[args.index("--traceparent") + 1].split("-")[1] == TRACE_ID
        deliveries = [s for s in spans_of(exporter, env.id) if s.name == "job process"]
        assert len(deliveries) == 2 and {d.context.trace_id for d in deliveries} == {int(TRACE_ID, 16)}
        assert [d.attributes["job.outcome"] for d in deliveries] == ["offloaded", "offloaded"]  # type: ignore[index]
    finally:
        server.stop()
