"""The job metrics operators alert on, through OpenTelemetry (issue 36).

Counted in memory from the decisions every process logs (`shared.observability.decisions`
listeners), exported by whatever meter provider the process has (Azure Monitor: customMetrics;
OTLP): no storage request per message. Names and attributes (no job id: one series per kind):

- `jobs.deliveries` {job.kind, job.outcome}: each decision about a delivery (completed,
  retry_scheduled, poisoned, failed, busy, duplicate, a continuation's status, ...);
- `jobs.duration` (s) {job.kind}: handler time of completed jobs;
- `jobs.retries` {job.kind}; `jobs.poisoned` {job.kind, job.reason_code};
- `jobs.takeovers` {job.kind}: claims over a dead run; `jobs.recoveries`: ended claims re-sent;
- `jobs.queue.depth` / `jobs.queue.oldest_age` (s) {queue: jobs | poison | parked}: sampled by the
  `sample_queues` timer (shared/observability/queue_metrics.py);
- `jobs.spark.runs_in_flight` / `jobs.spark.oldest_run_age` (s): from the same sample.

With several queues (JOBS_QUEUES) each of these also says `queue_name`: the delivery's queue
(from its decision's `queue`), the sampled queue's owner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics

from shared.observability import tracing
from shared.observability.decisions import add_listener

METER_NAME = "jobs"
NOT_DELIVERIES = frozenset(
    {"console_action", "op_started", "op_resumed", "recovered", "resent_unclaimed", "replayed", "archived"}
)
"""Decisions that are not about a delivery (counted elsewhere, or not at all)."""
DURATION_BOUNDS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)

QUEUE_DEPTH_METRIC = "jobs.queue.depth"
QUEUE_AGE_METRIC = "jobs.queue.oldest_age"
DELIVERIES_METRIC = "jobs.deliveries"
"""Names the alert rules of infra/main.bicep query (tests/deploy/test_infra.py checks them)."""

_meter = metrics.get_meter(METER_NAME)
DELIVERIES = _meter.create_counter(
    "jobs.deliveries", unit="{delivery}", description="Decisions about deliveries"
)
DURATION = _meter.create_histogram(
    "jobs.duration",
    unit="s",
    description="Handler time of completed jobs",
    explicit_bucket_boundaries_advisory=list(DURATION_BOUNDS_S),
)
RETRIES = _meter.create_counter("jobs.retries", unit="{retry}", description="Retries scheduled")
POISONED = _meter.create_counter("jobs.poisoned", unit="{job}", description="Jobs poisoned, by reason code")
TAKEOVERS = _meter.create_counter("jobs.takeovers", unit="{claim}", description="Claims over a dead run")
RECOVERIES = _meter.create_counter("jobs.recoveries", unit="{job}", description="Ended claims re-sent")
REPLAYS = _meter.create_counter("jobs.replays", unit="{job}", description="Poisoned jobs replayed")
QUEUE_DEPTH = _meter.create_gauge(QUEUE_DEPTH_METRIC, unit="{message}", description="Approximate messages")
QUEUE_AGE = _meter.create_gauge(
    QUEUE_AGE_METRIC, unit="s", description="Age of the first visible message (0: none)"
)
SPARK_IN_FLIGHT = _meter.create_gauge(
    "jobs.spark.runs_in_flight", unit="{run}", description="Spark runs held"
)
SPARK_AGE = _meter.create_gauge("jobs.spark.oldest_run_age", unit="s", description="Age of the oldest run")


def _kind(fields: Mapping[str, Any]) -> str:
    kind = fields.get("kind") or tracing.current_kind()
    return str(kind) if kind else "-"


def on_decision(decision: str, fields: Mapping[str, Any]) -> None:
    """Decision listener: count it (pure bookkeeping in memory)."""
    if decision == "recovered":
        RECOVERIES.add(1)
        return
    if decision == "replayed":
        REPLAYS.add(1)
        return
    if decision in NOT_DELIVERIES:
        return
    kind = _kind(fields)
    queue = {"queue_name": str(fields["queue"])} if fields.get("queue") else {}  # several queues
    DELIVERIES.add(1, {"job.kind": kind, "job.outcome": decision, **queue})
    if decision == "completed":
        duration = fields.get("duration_s")
        if isinstance(duration, int | float) and not isinstance(duration, bool) and duration >= 0:
            DURATION.record(float(duration), {"job.kind": kind, **queue})
    elif decision == "retry_scheduled":
        RETRIES.add(1, {"job.kind": kind, **queue})
    elif decision == "poisoned":
        code = fields.get("reason_code")
        POISONED.add(1, {"job.kind": kind, "job.reason_code": str(code) if code else "-", **queue})


def claimed(data: Mapping[str, Any]) -> None:
    """After a claim: a takeover of a dead run is marked on the delivery's span and counted."""
    if tracing.took_over(data):
        tracing.mark("job.takeover", True)
        TAKEOVERS.add(1, {"job.kind": tracing.current_kind() or "-"})


def queue_sample(queue: str, depth: int, oldest_age_s: float, name: str = "") -> None:
    """`queue`: jobs | poison | parked; `name`: the declared jobs queue it belongs to (JOBS_QUEUES)."""
    attributes = {"queue": queue, **({"queue_name": name} if name else {})}
    QUEUE_DEPTH.set(depth, attributes)
    QUEUE_AGE.set(round(oldest_age_s, 3), attributes)


def spark_sample(in_flight: int, oldest_age_s: float) -> None:
    SPARK_IN_FLIGHT.set(in_flight)
    SPARK_AGE.set(round(oldest_age_s, 3))


add_listener(on_decision)
