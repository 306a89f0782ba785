"""The aggregate kind's data outputs (`output.format` parquet | csv): the rows written as a blob
of their own in batches and staged blocks, then the result document naming it.

The data blob is `<RESULTS_CONTAINER>/<job id>.v<payload version>.<format>`
(`shared.aggregation.output.data_blob`): a retried write stages the same block ids and commits a
new block list, so the blob is replaced whole, never appended to; the result document is written
after that commit, so a document always names a whole blob.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shared.aggregation import result as aggregate_result
from shared.aggregation.output import CONTENT_TYPES, data_blob
from shared.aggregation.result_data import DATA_BATCH_ROWS, write_batches, write_data
from shared.aggregation.spill import ResultRows
from shared.jobs.base import Completed, JobContext
from shared.storage.ports import Blobs
from shared.storage.staged import BLOCK_BYTES

if TYPE_CHECKING:
    from shared.aggregation import AggregateSpec


def write_result(blobs: Blobs, name: str, document: Mapping[str, Any] | bytes) -> None:
    """Upload the result document, or its bytes from `result_json` (overwrite: a re-run of the
    same job writes the same blob)."""
    data = document if isinstance(document, bytes) else aggregate_result.dumps(document)
    blobs.write(name, data, content_type="application/json; charset=utf-8")


def write_data_result(
    ctx: JobContext,
    spec: AggregateSpec,
    rows: ResultRows,
    elapsed_s: float,
    *,
    batch_rows: int = DATA_BATCH_ROWS,
    block_bytes: int | None = None,
) -> Completed:
    """Write the engine's `rows` (in memory, or read back from a spilled run a batch at a time) as
    `spec.output.format` beside the result document, then the document (blocks of `block_bytes`,
    default `BLOCK_BYTES`)."""
    fmt = spec.output.format
    container = ctx.settings.results_container
    name = data_blob(ctx.job_id, ctx.version, fmt)
    results = ctx.storage.blobs(container)
    sink = results.writer(name, CONTENT_TYPES[fmt], block_bytes or BLOCK_BYTES)
    if rows.table is not None:
        written = write_data(rows.table, fmt, sink, batch_rows)
    else:
        written = write_batches(rows.batches(batch_rows), rows.schema, fmt, sink, batch_rows)
    input_rows = rows.input_rows
    size = sink.commit()
    output: dict[str, Any] = {
        "format": fmt,
        "result_ref": f"{container}/{name}",
        "rows": written.rows,
        "bytes": size,
        "columns": written.column_list(),
    }
    document = aggregate_result.data_result_document(ctx.job_id, output, input_rows, "inline", elapsed_s)
    write_result(results, aggregate_result.result_blob(ctx.job_id), document)
    ctx.log.info(
        "aggregate %s: %d rows -> %d groups in %.2fs (inline), written as %s: %s (%d bytes, %d blocks)",
        spec.input,
        input_rows,
        written.rows,
        elapsed_s,
        fmt,
        output["result_ref"],
        size,
        sink.blocks,
    )
    summary = {
        "input_rows": input_rows,
        "groups": written.rows,
        "engine": "inline",
        "output": {"format": fmt, "result_ref": output["result_ref"], "bytes": size},
    }
    return Completed(result_ref=aggregate_result.result_ref(container, ctx.job_id), summary=summary)
