"""W3C trace context across the queue hop, and the spans of a job's life (issue 36).

- The API's submission span continues the caller's `traceparent` / `tracestate` headers (or the
  envelope's own fields) and stamps its own context on the envelope (`submission_span`).
- Every message of the job carries that context (retries, continuations, re-checks and recovery
  re-sends copy the envelope; the poison archive keeps the body), so each delivery's span
  (`delivery_span`: CONSUMER, child of the envelope's context) and its steps (`step`: claim,
  handler, and the outcome: complete, continue, retry or poison) join the producer's trace.
- A replay starts a new trace whose root span links to the original one (`replayed`).
- Attributes name the job (id, kind, attempt, queue message id, dequeue count), the outcome and
  the reason code; never a payload, a body, an error text or a header other than trace context.
  Errors are named by their class only.

Spans go to whatever tracer provider the process has (Azure Monitor and/or OTLP, see
shared/observability/telemetry.py); without one they cost a context lookup and nothing is recorded. No
storage request is made here.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.core.envelope import Envelope
from shared.core.tracecontext import traceparent_problem, tracestate_problem
from shared.observability.decisions import add_listener

__all__ = [
    "OUTCOME_SPANS",
    "TRACER_NAME",
    "current_kind",
    "current_traceparent",
    "delivery_span",
    "inject_headers",
    "mark",
    "replayed",
    "step",
    "submission_span",
]

TRACER_NAME = "jobs"
PROPAGATOR = TraceContextTextMapPropagator()
OUTCOME_SPANS = {
    "completed": "job complete",
    "retry_scheduled": "job retry",
    "poisoned": "job poison",
    "failed": "job failed",
}
"""The outcome step's span name by decision (any other decision: `job continue`)."""
_job: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("job", default=None)
"""(job id, kind) of the delivery this thread / task is processing."""
_delivery: contextvars.ContextVar[trace.Span | None] = contextvars.ContextVar("job_delivery", default=None)


def _tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def carrier_of(env: Envelope) -> dict[str, str]:
    """The envelope's trace context as propagation headers."""
    carrier = {}
    if env.traceparent:
        carrier["traceparent"] = env.traceparent
        if env.tracestate:
            carrier["tracestate"] = env.tracestate
    return carrier


def current_traceparent() -> tuple[str | None, str | None]:
    """The current span's `traceparent` and `tracestate` (None, None without a valid context)."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier.get("traceparent"), carrier.get("tracestate") or None


def inject_headers(headers: dict[str, str]) -> dict[str, str]:
    """Add the current `traceparent` / `tracestate` to outbound HTTP headers; returns them."""
    PROPAGATOR.inject(headers)
    return headers


def stamped(env: Envelope) -> Envelope:
    """The envelope carrying the current span's context (unchanged without a valid one)."""
    traceparent, tracestate = current_traceparent()
    if traceparent is None:
        return env
    return replace(env, traceparent=traceparent, tracestate=tracestate)


def job_attributes(env: Envelope) -> dict[str, Any]:
    return {"job.id": env.id, "job.kind": env.kind, "job.attempt": env.attempt}


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value.strip() if isinstance(value, str) else None


def request_carrier(headers: Mapping[str, str], env: Envelope) -> dict[str, str]:
    """The caller's trace context (pure): valid `traceparent` / `tracestate` headers, else the
    envelope's own fields. An invalid header is ignored, as W3C asks (a new trace starts)."""
    traceparent = _header(headers, "traceparent")
    if traceparent is None or traceparent_problem(traceparent) is not None:
        return carrier_of(env)
    carrier = {"traceparent": traceparent}
    tracestate = _header(headers, "tracestate")
    if tracestate and tracestate_problem(tracestate) is None:
        carrier["tracestate"] = tracestate
    return carrier


@contextmanager
def submission_span(env: Envelope, headers: Mapping[str, str]) -> Iterator[Envelope]:
    """POST /api/jobs: a PRODUCER span under the caller's context; yields the envelope stamped with it."""
    parent = PROPAGATOR.extract(request_carrier(headers, env))
    with _tracer().start_as_current_span(
        "job submit", context=parent, kind=SpanKind.PRODUCER, attributes=job_attributes(env),
        record_exception=False, set_status_on_exception=False,
    ) as span:  # fmt: skip
        try:
            yield stamped(env) if span.get_span_context().is_valid else env
        except BaseException as exc:
            _error(span, exc)
            raise


def _parent_of(env: Envelope) -> tuple[Context | None, list[Link]]:
    """A delivery's parent (the envelope's context) and a link to the invocation's own span
    (the Functions host's, when it has one in another trace)."""
    current = trace.get_current_span().get_span_context()
    if not env.traceparent:
        return None, []
    parent = PROPAGATOR.extract(carrier_of(env))
    links = []
    if current.is_valid and current.trace_id != trace.get_current_span(parent).get_span_context().trace_id:
        links.append(Link(current))
    return parent, links


@contextmanager
def delivery_span(env: Envelope, message_id: str | None, dequeue_count: int | None) -> Iterator[None]:
    """One delivery of a job message: a CONSUMER span under the envelope's trace context."""
    parent, links = _parent_of(env)
    attributes = {
        **job_attributes(env),
        "messaging.system": "azure.storage.queue",
        "messaging.operation.type": "process",
        "messaging.message.id": message_id or "",
        "messaging.azure.queue.dequeue_count": dequeue_count or 0,
    }
    token = _job.set((env.id, env.kind))
    try:
        with _tracer().start_as_current_span(
            "job process", context=parent, kind=SpanKind.CONSUMER, attributes=attributes, links=links,
            record_exception=False, set_status_on_exception=False,
        ) as span:  # fmt: skip
            span_token = _delivery.set(span)
            try:
                yield
            except BaseException as exc:
                _error(span, exc)
                raise
            finally:
                _delivery.reset(span_token)
    finally:
        _job.reset(token)


@contextmanager
def step(name: str) -> Iterator[trace.Span]:
    """A step of the current delivery (`claim`, `handler`, `outcome`): an INTERNAL child span."""
    job = _job.get()
    attributes = {"job.id": job[0], "job.kind": job[1]} if job else {}
    with _tracer().start_as_current_span(
        f"job {name}", attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield span
        except BaseException as exc:
            _error(span, exc)
            raise


def _error(span: trace.Span, exc: BaseException) -> None:
    """Name the error by its class and reason code only (its text may quote a payload)."""
    span.set_attribute("error.type", exc.__class__.__name__)
    code = getattr(exc, "reason_code", None)
    if isinstance(code, str):
        span.set_attribute("job.reason_code", code)
    span.set_status(Status(StatusCode.ERROR, exc.__class__.__name__))


def current_kind() -> str | None:
    """The kind of the job whose delivery this thread is processing."""
    job = _job.get()
    return job[1] if job else None


def mark(name: str, value: str | bool | int) -> None:
    """Set an attribute on the current delivery's span (no-op outside a delivery)."""
    span = _delivery.get()
    if span is not None:
        span.set_attribute(name, value)


def replayed(env: Envelope) -> Envelope:
    """A replay: a new trace, whose root span links to the job's first trace; returns the envelope
    stamped with the new context (unchanged when no tracer provider records spans)."""
    links = []
    if env.traceparent:
        original = trace.get_current_span(PROPAGATOR.extract(carrier_of(env))).get_span_context()
        if original.is_valid:
            links.append(Link(original, {"job.link": "replay_of"}))
    with _tracer().start_as_current_span(
        "job replay", context=Context(), kind=SpanKind.PRODUCER, links=links, attributes=job_attributes(env)
    ) as span:
        if not span.get_span_context().is_valid:
            return env
        traceparent, tracestate = current_traceparent()
        return replace(env, traceparent=traceparent, tracestate=tracestate)


def took_over(data: Mapping[str, Any]) -> bool:
    """Whether a claim's record says it took over a dead run (its last history entry, pure)."""
    history = data.get("history")
    last = history[-1] if isinstance(history, list) and history else None
    return isinstance(last, Mapping) and last.get("event") == "claimed" and bool(last.get("takeover_of"))


def on_decision(decision: str, fields: Mapping[str, Any]) -> None:
    """Decision listener: the outcome and reason code on the current span (the outcome step's
    name follows the decision)."""
    span, delivery = trace.get_current_span(), _delivery.get()
    code = fields.get("reason_code")
    for target in (span, delivery) if delivery is not None and delivery is not span else (span,):
        if not target.is_recording():
            continue
        target.set_attribute("job.outcome", decision)
        if isinstance(code, str):
            target.set_attribute("job.reason_code", code)
    if span.is_recording() and getattr(span, "name", None) == "job outcome":
        span.update_name(OUTCOME_SPANS.get(decision, "job continue"))


add_listener(on_decision)
