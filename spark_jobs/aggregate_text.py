"""The aggregate job's CSV and JSON-lines input (spark_jobs/aggregate_job.py): one Spark job of
tasks, each running the inline engine over its split, their results collected by the driver.

- Blob SDK mode (`blob_tasks`: the local cluster, Azurite): the blob is split into byte ranges;
  each task reads its range through the app's ranged reader (under the driver's ETag) and
  aggregates its whole lines (JSON lines) or records (CSV, quoted line breaks included: a split
  whose start was guessed wrongly is run again, `aggregate_splits`).
- Hadoop mode (`hadoop_tasks`, `--input-url`): `sc.textFile`, whose splits follow Hadoop's line
  rule; a CSV quoted value holding a line break across two of them is refused with the reason.

Each task first loads the scanner the driver shipped (`aggregate_native.load`), then unpickles the
payload's partials (which imports the engine). Shipped to the cluster in the engine zip
(`JOB_MODULES`); imports the engine inside its functions.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

from spark_jobs.aggregate_native import ScannerChoice, load
from spark_jobs.aggregate_partials import Partials, TaskResult, run_split
from spark_jobs.aggregate_splits import csv_header, plan_splits, split_lines, split_records, wrong_starts

HADOOP_QUOTED_BREAK = (
    "a quoted CSV value holds a line break across a split of the Hadoop connector (--input-url "
    "splits at every line break): quoted line breaks are read on Spark in Blob SDK mode only"
)


def blob_tasks(
    sc: Any, access: Any, partials: Partials, split_bytes: int, choice: ScannerChoice
) -> tuple[list[TaskResult], int]:
    """Each byte-range split's `TaskResult`, in input order, and the header's lines."""
    from azure.core.exceptions import ResourceNotFoundError

    from shared.core.errors import InputDataError, InputMissing

    spec = partials.spec
    container, blob_name = spec.container, spec.blob
    try:
        props = access.service().get_blob_client(container, blob_name).get_blob_properties()
    except ResourceNotFoundError:
        raise InputMissing(f"input {container}/{blob_name} does not exist") from None
    size, etag = int(props.size), props.etag

    def reader(ranges: Any) -> Callable[[int, int], bytes]:
        def read(offset: int, length: int) -> bytes:
            data: bytes = ranges.read_range(container, blob_name, offset, length, etag)
            return data

        return read

    csv = spec.format == "csv"
    header = b""
    if csv:
        if size == 0:
            raise InputDataError("the input is empty: a CSV input needs a header line")
        header = csv_header(reader(access.ranges()), size)
    splits = plan_splits(len(header), size, split_bytes, sc.defaultParallelism)
    shipped = pickle.dumps(partials)

    def task(item: tuple[int, bool | None]) -> TaskResult:
        index, inside = item
        status = load(choice)
        mine: Partials = _partials(shipped)
        s, e = splits[index]
        read = reader(access.ranges())
        quotes = 0
        if csv:
            data, quotes, inside = split_records(read, size, s, e, index == 0, inside)
        else:
            data = split_lines(read, size, s, e, first=index == 0)
        result = run_split(mine, index, data, header)
        result.quotes, result.inside, result.scanner = quotes, bool(inside), status
        return result

    items: list[tuple[int, bool | None]] = [(i, None) for i in range(len(splits))]
    results = sc.parallelize(items, len(items)).map(task).collect()
    if csv:
        wrong = wrong_starts([(r.index, r.quotes, r.inside) for r in sorted(results, key=_index)])
        if wrong:  # quoted line breaks across split starts guessed wrongly: those splits again
            again = {r.index: r for r in sc.parallelize(wrong, len(wrong)).map(task).collect()}
            results = [again.get(r.index, r) for r in results]
    return sorted(results, key=_index), header.count(b"\n") or (1 if header else 0)


def hadoop_tasks(sc: Any, url: str, partials: Partials, choice: ScannerChoice) -> list[TaskResult]:
    """Each `sc.textFile` partition's `TaskResult`, in input order."""
    from shared.core.errors import InputDataError

    lines_rdd = sc.textFile(url, minPartitions=sc.defaultParallelism)
    csv = partials.spec.format == "csv"
    header = (lines_rdd.first() + "\n").encode("utf-8") if csv else b""
    shipped = pickle.dumps(partials)

    def task(index: int, lines: Iterator[str]) -> Iterator[TaskResult]:
        status = load(choice)
        mine: Partials = _partials(shipped)
        items = list(lines)
        if csv and index == 0:
            items = items[1:]
        data = ("\n".join(items) + "\n").encode("utf-8") if items else b""
        result = run_split(mine, index, data, header)
        result.quotes, result.scanner = data.count(b'"') if csv else 0, status
        yield result

    results = sorted(lines_rdd.mapPartitionsWithIndex(task).collect(), key=_index)
    if csv and wrong_starts([(r.index, r.quotes, False) for r in results]):
        raise InputDataError(HADOOP_QUOTED_BREAK)
    return results


_cache: dict[bytes, Any] = {}


def _partials(shipped: bytes) -> Any:
    """The driver's `Partials`, unpickled once per process (after `load`: it imports the engine)."""
    if shipped not in _cache:
        _cache.clear()
        _cache[shipped] = pickle.loads(shipped)
    return _cache[shipped]


def _index(result: TaskResult) -> int:
    return result.index
