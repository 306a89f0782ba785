"""The aggregate kind on Spark: what is submitted (spark_jobs/aggregate_job.py and its arguments)
and how its outcome is read back (the result document and error report of
`shared.aggregation.result`). The tracking itself is `shared.jobs.offload.runs`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, Final

from shared.aggregation import result as aggregate_result
from shared.aggregation.output import DATA_FORMATS
from shared.config.settings import Settings
from shared.core import jsontext
from shared.core.errors import InputRefused
from shared.jobs.base import Completed, JobContext, Outcome
from shared.jobs.offload import runs as tracking
from shared.jobs.offload.spark_storage import job_storage
from shared.observability import tracing
from shared.spark.model import RunError, SparkBackend, SparkJobRequest
from shared.storage.failures import NotFound
from shared.storage.limits import BlobTooLarge, input_refusal, result_limit_bytes
from shared.storage.ports import Account, Blobs

ERROR_MAX_BYTES: Final = 1024 * 1024
"""An error report is a few hundred bytes; a larger one is not read."""
END_BYTES: Final = 4096
"""Bytes read at each end of a result document too large to read whole."""


def run_name(job_id: str, submission: int) -> str:
    """Unique per (job, submission): how a run is found again after a timed-out create."""
    return f"aggregate-{job_id}-s{submission}"


def build_request(ctx: JobContext, submission: int) -> SparkJobRequest:
    """The submission for this job: script, arguments (no secrets) and driver environment.

    InputRefused when the settings forbid the input's container: no run is ever submitted (or
    looked up) for it.
    """
    spark = ctx.settings.spark
    payload = json.dumps(dict(ctx.payload), sort_keys=True, separators=(",", ":"))
    encoded = base64.urlsafe_b64encode(payload.encode()).decode()
    input_ref = str(ctx.payload.get("input", ""))
    refusal = input_refusal(input_ref.partition("/")[0], ctx.settings)
    if refusal is not None:
        raise InputRefused(refusal)
    access = job_storage(ctx.settings, input_ref)
    args = [
        ctx.job_id,
        encoded,
        ctx.settings.results_container,
        "--submission",
        str(submission),
        *access.args,
    ]
    if spark.split_mb:
        args += ["--split-mb", f"{spark.split_mb:g}"]
    output = ctx.payload.get("output")
    if isinstance(output, Mapping) and output.get("format") in DATA_FORMATS:
        args += ["--version", str(ctx.version)]  # names the data blob: one per payload version
    traceparent, _ = tracing.current_traceparent()
    if traceparent:  # issue 36: the driver's log records carry the job's trace id
        args += ["--traceparent", traceparent]
    return SparkJobRequest(
        job_id=ctx.job_id,
        submission=submission,
        name=run_name(ctx.job_id, submission),
        job_file=spark.job_file,
        args=args,
        py_files=list(spark.py_files),
        env=access.env,
    )


class AggregateWork:
    """`shared.jobs.offload.runs.OffloadWork` for aggregate jobs."""

    def request(self, ctx: JobContext, submission: int) -> SparkJobRequest:
        return build_request(ctx, submission)

    def finished(self, ctx: JobContext) -> Completed | None:
        results = ctx.storage.blobs(ctx.settings.results_container)
        doc = read_result(results, ctx.job_id, result_limit_bytes(ctx.settings.max_groups))
        return None if doc is None else completed(ctx.settings.results_container, ctx.job_id, doc)

    def run_error(self, ctx: JobContext, submission: int) -> RunError | None:
        results = ctx.storage.blobs(ctx.settings.results_container)
        return read_error(results, ctx.job_id, submission)


WORK: Final = AggregateWork()


def offload(
    ctx: JobContext, spec: object = None, *, backend: SparkBackend | None = None, reason: str = ""
) -> Outcome:
    """Hand the aggregate job to Spark (`spec` is not needed: the job gets the validated payload)."""
    del spec
    return tracking.offload(ctx, WORK, backend=backend, reason=reason)


def resume(
    ctx: JobContext, spec: object = None, *, backend: SparkBackend | None = None, now: float | None = None
) -> Outcome:
    """Follow the aggregate job's Spark run."""
    del spec
    return tracking.resume(ctx, WORK, backend=backend, now=now)


def abandon(
    settings: Settings,
    storage: Account,
    job_id: str,
    saved: Mapping[str, Any],
    *,
    backend: SparkBackend | None = None,
) -> dict[str, Any] | None:
    """The job is poisoned while offloaded: cancel its run, free its slot."""
    return tracking.abandon(settings, storage, job_id, saved, backend=backend)


def completed(container: str, job_id: str, doc: Mapping[str, Any]) -> Completed:
    """The ledger's summary of a verified result document."""
    rows = doc.get("rows")
    output = doc.get("output")
    groups = len(rows) if isinstance(rows, list) else None
    summary: dict[str, Any] = {
        "engine": doc.get("engine", "spark"),
        "input_rows": doc.get("input_rows"),
        "groups": output.get("rows") if isinstance(output, Mapping) else groups,
        "engine_elapsed_s": doc.get("elapsed_s"),
    }
    if isinstance(output, Mapping):  # a data output: the blob holding the rows
        summary["output"] = {k: output.get(k) for k in ("format", "result_ref", "bytes")}
    if "result_bytes" in doc:  # too large to read whole (more groups than MAX_GROUPS allows)
        summary["result_bytes"] = doc["result_bytes"]
    return Completed(result_ref=aggregate_result.result_ref(container, job_id), summary=summary)


# --- reading what a run wrote ------------------------------------------------------------------


def read_result(container: Blobs, job_id: str, max_bytes: int) -> dict[str, Any] | None:
    """The result document if it exists and belongs to `job_id`; None otherwise.

    A document over `max_bytes` (a run with more groups than MAX_GROUPS allows) is never read
    whole: its two ends are, to check whose it is, and the answer has `input_rows`, `engine`,
    `elapsed_s` and `result_bytes` but no `rows`.
    """
    name = aggregate_result.result_blob(job_id)
    try:
        doc = _read_json(container, name, max_bytes)
    except BlobTooLarge as big:
        return _ends(container, name, job_id, big.size)
    return doc if aggregate_result.is_result_of(doc, job_id) else None


def read_error(container: Blobs, job_id: str, submission: int) -> RunError | None:
    """The error report of one submission, if the job managed to write one."""
    try:
        doc = _read_json(container, aggregate_result.error_blob(job_id, submission), ERROR_MAX_BYTES)
    except BlobTooLarge:
        return None
    if doc is None or doc.get("id") != job_id or doc.get("submission") != submission:
        return None
    kind = str(doc.get("kind") or "unexpected")
    return RunError(message=str(doc.get("error") or ""), permanent=kind in aggregate_result.PERMANENT_KINDS)


def _ends(blobs: Blobs, name: str, job_id: str, size: int) -> dict[str, Any] | None:
    """The members of a large result document other than its rows, from its first and last bytes
    (the last If-Match the first's ETag)."""
    try:
        first, etag = blobs.read_range(name, 0, END_BYTES)
        start = max(0, size - END_BYTES)
        last, _ = blobs.read_range(name, start, size - start, etag)
    except NotFound:
        return None
    match = aggregate_result.TAIL.search(last)
    if not first.startswith(aggregate_result.head_bytes(job_id)) or match is None:
        return None
    try:
        engine = json.loads(match.group(2))
        elapsed = float(match.group(3))
    except ValueError:
        return None
    return {
        "id": job_id,
        "input_rows": int(match.group(1)),
        "engine": engine,
        "elapsed_s": elapsed,
        "result_bytes": size,
    }


def _read_json(blobs: Blobs, name: str, max_bytes: int) -> dict[str, Any] | None:
    """The blob as a JSON object (None if absent or not one); BlobTooLarge over `max_bytes`."""
    try:
        raw = blobs.read_capped(name, max_bytes)
    except NotFound:
        return None
    try:
        doc = jsontext.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
