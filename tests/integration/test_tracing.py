"""Issue 36: one job across every hop under one W3C trace, and the job metrics; on the in-memory
account and on Azurite, with the SDK's in-memory exporter (the OTLP path: test_otlp_host.py)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import azure.functions as func
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from shared import ledger, poison
from shared.core.envelope import Envelope, decode_message, parse_body
from shared.interfaces import api
from shared.ledger import Facts
from shared.observability import queue_metrics
from shared.pipeline.processing import process_message
from shared.pipeline.recovery import recover_claims
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend
from tests.integration.helpers import message
from tests.otel_support import counter_value, memory_telemetry, metric_points, spans_of

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
SECRET = "s3cr3t-payload-value"


@pytest.fixture
def otel() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    exporter, reader = memory_telemetry()
    exporter.clear()
    return exporter, reader


@pytest.fixture
def rt(storage_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    runtime = storage_backend.runtime(MAX_ATTEMPTS="3", RETRY_BASE_SECONDS="0")
    monkeypatch.setattr(api, "get_runtime", lambda: runtime)
    monkeypatch.setattr(runtime, "wait", storage_backend.wait, raising=False)
    yield runtime


def post(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    req = func.HttpRequest(
        method="POST", url="http://localhost/api/jobs", body=json.dumps(body).encode(), headers=headers
    )
    resp = api.submit_job(req)
    return resp.status_code, json.loads(resp.get_body())


def drain(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    """What the host does for process_job until the job is settled (a retry is due after 1 s);
    the bodies delivered."""
    client = rt.account.raw_queue(rt.settings.jobs_queue)
    bodies = []
    for _ in range(20):
        for msg in client.receive_messages(max_messages=32, visibility_timeout=60):
            raw = base64.b64decode(msg.content)
            bodies.append(json.loads(raw))
            process_message(message(raw, msg.dequeue_count, msg.id), rt)
            client.delete_message(msg)
        record = rt.ledger.get(job_id)
        if record is not None and record.status in ("completed", "poisoned"):
            return bodies
        rt.wait(0.5)  # type: ignore[attr-defined]
    return bodies


def names(spans: list[ReadableSpan]) -> list[str]:
    return [s.name for s in spans]


def exported_text(spans: Sequence[ReadableSpan]) -> str:
    """Everything a span exporter would send about these spans, as text."""
    return json.dumps([json.loads(s.to_json()) for s in spans])


def test_a_posted_traceparent_carries_through_submission_retry_and_completion(
    rt: Runtime, otel: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    exporter, reader = otel
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    retries_before = counter_value(reader, "jobs.retries", **{"job.kind": "fault"})
    body = {"id": job_id, "kind": "fault", "payload": {"transient_failures": 1, "note": SECRET}}
    status, answer = post(body, {"traceparent": TRACEPARENT, "tracestate": "vendor=1"})
    assert status == 202, answer
    delivered = drain(rt, job_id)
    assert rt.ledger.get(job_id).status == "completed"  # type: ignore[union-attr]
    # every message of the job (the first, and the retry) carries the submission's context
    assert [b["attempt"] for b in delivered] == [0, 1]
    assert {b["traceparent"].split("-")[1] for b in delivered} == {TRACE_ID}
    assert {b["tracestate"] for b in delivered} == {"vendor=1"}

    spans = spans_of(exporter, job_id)
    assert {s.context.trace_id for s in spans} == {int(TRACE_ID, 16)}, names(spans)
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    [submit] = by_name["job submit"]
    assert submit.kind is SpanKind.PRODUCER and submit.parent is not None
    assert submit.parent.span_id == int(CALLER_SPAN, 16)
    deliveries = by_name["job process"]
    assert [d.attributes["job.attempt"] for d in deliveries] == [0, 1]  # type: ignore[index]
    assert all(d.parent is not None and d.parent.span_id == submit.context.span_id for d in deliveries)
    assert [d.attributes["job.outcome"] for d in deliveries] == ["retry_scheduled", "completed"]  # type: ignore[index]
    assert all(d.kind is SpanKind.CONSUMER for d in deliveries)
    assert len(by_name["job claim"]) == 2 and len(by_name["job handler"]) == 2
    assert len(by_name["job retry"]) == 1 and len(by_name["job complete"]) == 1
    delivery_ids = {d.context.span_id for d in deliveries}
    for step in (
        by_name["job claim"] + by_name["job handler"] + by_name["job retry"] + by_name["job complete"]
    ):
        assert step.parent is not None and step.parent.span_id in delivery_ids
    [failed_handler] = [h for h in by_name["job handler"] if h.status.status_code.name == "ERROR"]
    assert failed_handler.attributes["error.type"] == "DownstreamUnavailable"  # type: ignore[index]
    assert SECRET not in exported_text(exporter.get_finished_spans())
    # the metrics counted the retry and the outcomes
    assert counter_value(reader, "jobs.retries", **{"job.kind": "fault"}) == retries_before + 1
    durations = [p for attrs, p in metric_points(reader, "jobs.duration") if attrs == {"job.kind": "fault"}]
    assert durations and durations[0].count >= 1


def test_an_invalid_traceparent_header_starts_a_new_trace_and_an_invalid_envelope_field_is_refused(
    rt: Runtime, otel: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    exporter, _ = otel
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    status, _answer = post({"id": job_id, "kind": "noop", "payload": {}}, {"traceparent": "00-zz-bad-01"})
    assert status == 202
    [submit] = spans_of(exporter, job_id)
    assert submit.parent is None and submit.context.trace_id != int(TRACE_ID, 16)
    status, answer = post({"kind": "noop", "payload": {}, "traceparent": "00-bad"}, {})
    assert status == 400 and any(p.startswith("traceparent:") for p in answer["problems"]), answer


def test_a_producers_envelope_traceparent_is_the_deliverys_parent(
    rt: Runtime, otel: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    exporter, _ = otel
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    process_message(message({"id": job_id, "kind": "noop", "payload": {}, "traceparent": TRACEPARENT}), rt)
    spans = spans_of(exporter, job_id)
    assert names(spans) == ["job claim", "job handler", "job complete", "job process"]
    assert {s.context.trace_id for s in spans} == {int(TRACE_ID, 16)}
    assert spans[-1].parent is not None and spans[-1].parent.span_id == int(CALLER_SPAN, 16)


def test_a_poisoned_then_replayed_job_runs_in_a_new_trace_linked_to_the_first(
    rt: Runtime, otel: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    exporter, reader = otel
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    marker = f"fix-{job_id}"
    poisoned_before = counter_value(
        reader, "jobs.poisoned", **{"job.kind": "fault", "job.reason_code": "bad_input_data"}
    )
    body = {
        "id": job_id,
        "kind": "fault",
        "payload": {"fail_unless_blob": marker},
        "traceparent": TRACEPARENT,
    }
    process_message(message(body), rt)
    assert rt.ledger.get(job_id).status == "poisoned"  # type: ignore[union-attr]
    first = spans_of(exporter, job_id)
    assert names(first)[-2:] == ["job poison", "job process"]
    assert first[-1].attributes["job.reason_code"] == "bad_input_data"  # type: ignore[index]
    assert (
        counter_value(reader, "jobs.poisoned", **{"job.kind": "fault", "job.reason_code": "bad_input_data"})
        == poisoned_before + 1
    )
    client = rt.account.raw_queue(rt.settings.poison_queue)  # the host's poison trigger archives it
    for msg in client.receive_messages(max_messages=32, visibility_timeout=60):
        poison.handle_poison_message(message(msg.content.encode(), msg.dequeue_count, msg.id), rt)
        client.delete_message(msg)
    rt.account.blobs(rt.settings.results_container).write(marker, b"fixed", overwrite=False)
    exporter.clear()

    report = poison.replay_jobs(rt, [job_id])
    assert report.replayed == [job_id]
    [resent] = drain(rt, job_id)
    assert rt.ledger.get(job_id).status == "completed"  # type: ignore[union-attr]
    spans = spans_of(exporter, job_id)
    [replay] = [s for s in spans if s.name == "job replay"]
    assert replay.parent is None and replay.context.trace_id != int(TRACE_ID, 16)
    assert [(link.context.trace_id, link.context.span_id) for link in replay.links] == [
        (int(TRACE_ID, 16), int(CALLER_SPAN, 16))
    ]
    assert resent["traceparent"].split("-")[1] == format(replay.context.trace_id, "032x")
    [delivery] = [s for s in spans if s.name == "job process"]
    assert delivery.context.trace_id == replay.context.trace_id
    assert delivery.parent is not None and delivery.parent.span_id == replay.context.span_id


def test_a_takeover_is_marked_and_counted(
    rt: Runtime, otel: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    exporter, reader = otel
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    before = counter_value(reader, "jobs.takeovers", **{"job.kind": "noop"})
    rt.ledger.create(
        job_id,
        {
            "id": job_id,
            "status": "in_progress",
            "attempt": 0,
            "owner": "dead",
            "lease_until": "2020-01-01T00:00:00Z",
        },
    )
    process_message(message({"id": job_id, "kind": "noop", "payload": {}}), rt)
    [delivery] = [s for s in spans_of(exporter, job_id) if s.name == "job process"]
    assert delivery.attributes["job.takeover"] is True  # type: ignore[index]
    assert counter_value(reader, "jobs.takeovers", **{"job.kind": "noop"}) == before + 1


def test_queue_sample_sets_depth_and_oldest_age_gauges(
    rt: Runtime, otel: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    _, reader = otel
    rt.account.raw_queue(rt.settings.poison_queue).send_message(base64.b64encode(b"x").decode())
    samples = {s.queue: s for s in queue_metrics.sample(rt)}
    assert samples["poison"].depth == 1 and samples["jobs"].depth == 0
    assert samples["poison"].oldest_age_s >= 0 and samples["jobs"].oldest_age_s == 0
    depth = {attrs["queue"]: p.value for attrs, p in metric_points(reader, "jobs.queue.depth")}
    assert depth["poison"] == 1 and depth["jobs"] == 0


def test_telemetry_adds_no_storage_request_to_the_happy_path(
    rt: Runtime,
    storage_backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    """test_processing's happy-path count (3 requests) with spans and metrics recorded."""
    exporter, _ = otel
    process_message(message({"id": "k0", "kind": "noop", "payload": {}}), rt)
    sent = storage_backend.record_requests(monkeypatch)
    process_message(message({"id": "k1", "kind": "noop", "payload": {}, "traceparent": TRACEPARENT}), rt)
    assert len(sent()) == 3, sent()
    assert len(spans_of(exporter, "k1")) == 4


def test_a_recovery_resend_keeps_the_jobs_trace_context_and_is_counted(
    rt: Runtime, otel: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    _, reader = otel
    before = counter_value(reader, "jobs.recoveries")
    now = rt.clock()
    env = Envelope(
        id=f"t-{uuid.uuid4().hex[:8]}", kind="noop", created_at=now, payload={}, traceparent=TRACEPARENT
    )
    facts = Facts(now - timedelta(seconds=60), "m1", 1, "dead-host/1")
    rt.ledger.write(env.id, None, lambda prev: ledger.claimed(prev, env, facts, 30.0))
    assert env.id in recover_claims(rt).resent
    bodies = [
        parse_body(decode_message(m.content.encode()))
        for m in rt.account.raw_queue(rt.settings.jobs_queue).peek_messages()
    ]
    assert [(b.id, b.traceparent) for b in bodies] == [(env.id, TRACEPARENT)]
    assert counter_value(reader, "jobs.recoveries") == before + 1
