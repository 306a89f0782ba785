"""The `aggregate` job kind: engine choice, the result's upload and the handler.

The payload, the engine (pure, over a byte stream) and the result document are the
`shared.aggregation` package; the input is read through `shared.blobio.reader.open_blob_stream`.

Least privilege and bounded work: the input's container is checked before anything is read
(`shared.storage.limits.input_refusal`: never the app's or the host's own containers; only
`INPUT_CONTAINERS` when set), and an inline run stops at `MAX_GROUPS` groups: `engine: auto` then
goes to Spark when a backend is configured, otherwise the job is poisoned naming the limit.

The result: the JSON document (`output.format` json, the default), or the rows as Parquet / CSV in a
blob beside a small document naming it (`shared.jobs.aggregate_output`; on Spark, the driver
writes it: `spark_jobs/aggregate_job.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from shared import aggregation
from shared.aggregation import (
    AggregateResult,
    AggregateSpec,
    TooManyGroups,
    aggregate_rows,
    aggregate_table,
    parse_aggregate_payload,
)
from shared.aggregation import result as aggregate_result
from shared.aggregation.result import result_json
from shared.blobio.reader import open_blob_stream
from shared.blobio.spans import SpanReader
from shared.blobio.stream import BlobStream, Ranges
from shared.config.settings import Settings
from shared.core.containers import cut
from shared.core.errors import InputRefused, LimitExceeded, NotAvailable
from shared.jobs.aggregate_output import write_data_result, write_result
from shared.jobs.base import Completed, JobContext, Outcome
from shared.jobs.offload import aggregate_spark
from shared.storage.limits import input_refusal, result_limit_bytes
from shared.storage.ports import Account

if not aggregation.NATIVE:  # the remote build could not compile native/: same answers, slower
    logging.getLogger(__name__).warning(
        "the aggregate engine's C scanner (aggkernel, native/) is not installed: aggregate jobs "
        "run on the pyarrow path alone (same results; measured ~2x slower on CSV, ~4x on JSON "
        "lines); rebuild with a C compiler available (pip install ./native)"
    )

KIND: Final = "aggregate"


# --- engine choice and result document ---------------------------------------------------------


def check_input(spec: AggregateSpec, settings: Settings) -> None:
    """InputRefused when the settings forbid reading the input's container (pure, no I/O).

    The reason names the field and the rule, never anything stored in the container.
    """
    refusal = input_refusal(spec.container, settings)
    if refusal is not None:
        raise InputRefused(refusal)


def spark_takes_over(spec: AggregateSpec, settings: Settings) -> bool:
    """True when an inline run that reaches MAX_GROUPS goes to Spark instead (pure)."""
    return spec.engine == "auto" and settings.spark.backend != "none"


def too_many_groups(spec: AggregateSpec, settings: Settings, exc: TooManyGroups) -> LimitExceeded:
    """The permanent error of an inline run past MAX_GROUPS: the limit and what to do."""
    if settings.spark.backend == "none":
        spark = "configure a Spark backend (SPARK_BACKEND) and use engine 'auto'"
    else:
        spark = "use engine 'auto' or 'spark' (a Spark backend is configured)"
    grouped = ", ".join(spec.group_by)
    return LimitExceeded(
        f"the input has more than MAX_GROUPS={settings.max_groups} groups "
        f"(group_by: {cut(grouped) or 'none'}; {exc.seen} found before stopping): "
        f"narrow group_by, raise MAX_GROUPS, or {spark}"
    )


def choose_engine(spec: AggregateSpec, blob_size: int | None, settings: Settings) -> str:
    """'inline' or 'spark' (pure). `auto` offloads inputs over the threshold when Spark exists."""
    if spec.engine != "auto":
        return spec.engine
    spark = settings.spark
    if spark.backend != "none" and blob_size is not None and blob_size > spark.offload_threshold_bytes:
        return "spark"
    return "inline"


def result_document(job_id: str, result: AggregateResult, engine: str, elapsed_s: float) -> dict[str, Any]:
    """The result blob's JSON document (shape: `shared.aggregation.result`)."""
    return aggregate_result.result_document(job_id, result.rows, result.input_rows, engine, elapsed_s)


def open_input(source: Ranges, spec: AggregateSpec) -> BlobStream | SpanReader:
    """CSV and JSON lines: a stream of the blob, read ahead in parallel. Parquet: ranged reads of
    the spans asked for (the footer, then the needed column chunks); one small GET now."""
    if spec.format == "parquet":
        return SpanReader(source)
    return open_blob_stream(source)


def drop_kept_buffers(stream: BlobStream | SpanReader) -> None:
    """Free the read buffers a closed stream left for the next input (a result that spilled is
    written next, and its writers' memory matters more than the next read's first page faults)."""
    if isinstance(stream, BlobStream):
        stream.pool.drop()


# --- the handler -------------------------------------------------------------------------------


class AggregateHandler:
    """Group-by aggregation of a CSV / JSON-lines / Parquet blob into `<results>/<job id>.json`."""

    kind = KIND

    def validate(self, payload: Mapping[str, Any]) -> None:
        """Raise PayloadError listing every problem; no I/O."""
        parse_aggregate_payload(payload)

    def run(self, ctx: JobContext) -> Outcome:
        """Stream the input through the inline engine and write the result document."""
        spec = parse_aggregate_payload(ctx.payload)
        check_input(spec, ctx.settings)  # before any read, and before any Spark run is followed
        if ctx.resume_state is not None:  # offloaded earlier: follow the Spark run, never resubmit blindly
            return aggregate_spark.resume(ctx, spec)
        if spec.engine == "spark" and ctx.settings.spark.backend == "none":
            raise NotAvailable("engine 'spark' is not available: SPARK_BACKEND=none")
        started = time.monotonic()
        source = ctx.storage.blobs(spec.container).ranges(spec.blob)
        settings = ctx.settings
        over_cap = False
        with open_input(source, spec) as stream:
            size = stream.size
            engine = choose_engine(spec, size, settings)
            if engine == "spark":
                return self.run_spark(ctx, spec, size, "engine" if spec.engine == "spark" else "size")
            try:
                if spec.output.is_data:  # past a bound, the groups spill to local disk
                    result_rows = aggregate_rows(stream, spec, max_groups=settings.max_groups)
                else:
                    table, input_rows = aggregate_table(stream, spec, max_groups=settings.max_groups)
            except TooManyGroups as exc:
                if not spark_takes_over(spec, settings):
                    raise too_many_groups(spec, settings, exc) from None
                over_cap = True  # offload once the stream and the partial aggregates are gone
        if over_cap:
            ctx.log.info(
                "aggregate %s: more than MAX_GROUPS=%d groups after %.2fs inline: handing it to Spark",
                spec.input,
                settings.max_groups,
                time.monotonic() - started,
            )
            return self.run_spark(ctx, spec, size, "max_groups")
        elapsed = time.monotonic() - started
        if spec.output.is_data:
            with result_rows:
                if result_rows.spilled is not None:  # many groups: the write's memory, not idle reads'
                    drop_kept_buffers(stream)
                return write_data_result(ctx, spec, result_rows, elapsed)
        container = settings.results_container
        name = aggregate_result.result_blob(ctx.job_id)
        limit = result_limit_bytes(settings.max_groups)
        data = result_json(ctx.job_id, table, input_rows, "inline", elapsed, max_bytes=limit)
        groups = table.num_rows
        del table
        write_result(ctx.storage.blobs(container), name, data)
        ctx.log.info(
            "aggregate %s: %d rows -> %d groups in %.2fs (inline)", spec.input, input_rows, groups, elapsed
        )
        return Completed(
            result_ref=aggregate_result.result_ref(container, ctx.job_id),
            summary={"input_rows": input_rows, "groups": groups, "engine": "inline"},
        )

    def run_spark(self, ctx: JobContext, spec: AggregateSpec, blob_size: int, reason: str) -> Outcome:
        """Hand the job to the configured Spark backend; the ledger tracks it as `offloaded`.

        `reason` (engine | size | max_groups) is kept in the offload state on the ledger.
        """
        return aggregate_spark.offload(ctx, spec, reason=reason)

    def abandon(
        self, settings: Settings, storage: Account, job_id: str, state: Mapping[str, Any]
    ) -> Mapping[str, Any] | None:
        """The job is poisoned while offloaded: cancel its Spark run on the cluster, free its slot."""
        return aggregate_spark.abandon(settings, storage, job_id, state)


HANDLER: Final = AggregateHandler()

__all__ = [
    "HANDLER",
    "KIND",
    "AggregateHandler",
    "check_input",
    "choose_engine",
    "result_document",
    "spark_takes_over",
    "too_many_groups",
    "write_result",
]
