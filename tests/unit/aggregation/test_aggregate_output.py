"""Results as data (issue 37): the payload's `output`, the Parquet / CSV writers in batches, the
staged blob writer and the data result's document, on the in-memory account (no network)."""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from shared.aggregation import parse_aggregate_payload
from shared.aggregation.output import JSON_OUTPUT, OutputSpec, data_blob
from shared.aggregation.result import is_result_of
from shared.aggregation.result_data import write_data
from shared.aggregation.spill import ResultRows
from shared.config.settings import Settings, SparkSettings, StorageConnection
from shared.core.errors import PayloadError
from shared.jobs.aggregate import choose_engine, spark_takes_over
from shared.jobs.aggregate_output import write_data_result
from shared.jobs.base import Completed
from shared.storage.failures import StorageError
from shared.storage.memory_account import MemoryAccount
from shared.storage.staged import StagedBlobWriter, block_id
from tests.unit.aggregation.aggregate_support import ctx_on

BASE: dict[str, Any] = {
    "input": "data/sales.csv",
    "format": "csv",
    "group_by": ["k"],
    "metrics": [{"op": "count"}, {"op": "sum", "column": "v"}],
}


def problems(payload: dict[str, Any]) -> list[str]:
    with pytest.raises(PayloadError) as refused:
        parse_aggregate_payload(payload)
    return list(refused.value.problems)


def result_table(n: int) -> pa.Table:
    """A result table as the engine gives it: a string key (nulls first), an int64 count, a double."""
    keys = [None, "", *(f"k{i:07d}" for i in range(n - 2))]
    return pa.table(
        {
            "k": pa.array(keys, pa.string()),
            "count": pa.array(range(n), pa.int64()),
            "sum_v": pa.array([None if i % 5 == 0 else i / 3 for i in range(n)], pa.float64()),
        }
    )


# --- the payload's output ----------------------------------------------------------------------


def test_output_defaults_to_json_and_takes_the_data_formats() -> None:
    assert parse_aggregate_payload(BASE).output == JSON_OUTPUT
    for fmt in ("json", "parquet", "csv"):
        spec = parse_aggregate_payload({**BASE, "output": {"format": fmt}})
        assert spec.output == OutputSpec(fmt) and spec.output.is_data is (fmt != "json")
    assert parse_aggregate_payload({**BASE, "output": {}}).output == JSON_OUTPUT


@pytest.mark.parametrize(
    ("output", "problem"),
    [
        ({"format": "xlsx"}, "payload.output.format: 'xlsx' is not one of json, parquet, csv"),
        ({"format": 3}, "payload.output.format: must be a string (one of json, parquet, csv)"),
        ("parquet", 'payload.output: must be an object such as {"format": "parquet"}'),
        ({"format": "csv", "rows": 10}, "payload.output: unknown key 'rows' (allowed: format)"),
    ],
)
def test_a_bad_output_is_refused_naming_the_field(output: object, problem: str) -> None:
    assert problems({**BASE, "output": output}) == [problem]


def test_a_data_output_takes_the_engine_choice_of_any_job() -> None:
    """Both engines write data outputs: `spark` is accepted, and `auto` offloads as for JSON."""
    assert parse_aggregate_payload(
        {**BASE, "engine": "spark", "output": {"format": "parquet"}}
    ).output.is_data
    settings = Settings(
        storage=StorageConnection(connection_string="UseDevelopmentStorage=true"),
        spark=SparkSettings(backend="standalone", offload_threshold_bytes=10),
    )
    parquet = parse_aggregate_payload({**BASE, "output": {"format": "parquet"}})
    assert (
        choose_engine(parquet, 1000, settings) == "spark" and choose_engine(parquet, 5, settings) == "inline"
    )
    assert spark_takes_over(parquet, settings)


def test_the_result_schema_is_the_inline_engines_table_schema() -> None:
    from shared.aggregation import aggregate_table
    from shared.aggregation.result_data import result_schema, row_batches, write_batches

    payload = {
        **BASE,
        "group_by": ["k", "j"],
        "metrics": [
            {"op": "count"},
            {"op": "count", "column": "v"},
            {"op": "sum", "column": "v"},
            {"op": "mean", "column": "v"},
            {"op": "min", "column": "v", "as": "low"},
            {"op": "max", "column": "v"},
        ],
    }
    spec = parse_aggregate_payload(payload)
    table, _ = aggregate_table(io.BytesIO(b"k,j,v\na,x,1\nb,,2\na,x,\n"), spec)
    schema = result_schema(spec)
    assert table.schema == schema
    rows = table.to_pylist()
    for fmt in ("parquet", "csv"):
        whole, batched = io.BytesIO(), io.BytesIO()
        write_data(table, fmt, whole, batch_rows=2)
        written = write_batches(row_batches(rows, schema, 2), schema, fmt, batched, batch_rows=2)
        assert written.rows == 2 and whole.getvalue() == batched.getvalue(), fmt


def test_the_data_blob_is_named_per_job_and_payload_version() -> None:
    assert data_blob("job-1", 0, "parquet") == "job-1.v0.parquet"
    assert data_blob("job-1", 2, "csv") == "job-1.v2.csv"


# --- the writers, in batches -------------------------------------------------------------------


def test_parquet_is_written_in_row_groups_of_the_batch_with_typed_columns() -> None:
    table = result_table(10_000)
    sink = io.BytesIO()
    written = write_data(table, "parquet", sink, batch_rows=3000)
    assert written.rows == 10_000
    assert written.column_list() == [
        {"name": "k", "type": "string"},
        {"name": "count", "type": "int64"},
        {"name": "sum_v", "type": "double"},
    ]
    parquet = pq.ParquetFile(io.BytesIO(sink.getvalue()))
    assert parquet.num_row_groups == 4  # 3000 + 3000 + 3000 + 1000
    assert [parquet.metadata.row_group(i).num_rows for i in range(4)] == [3000, 3000, 3000, 1000]
    assert parquet.read().equals(table)


def test_csv_is_written_with_a_header_quoted_strings_and_empty_nulls() -> None:
    table = result_table(5)
    sink = io.BytesIO()
    assert write_data(table, "csv", sink, batch_rows=2).rows == 5
    text = sink.getvalue().decode()
    assert text.splitlines() == [
        '"k","count","sum_v"',
        ",0,",  # a null key, a null sum: empty and unquoted
        '"",1,0.3333333333333333',  # the empty key: quoted
        '"k0000000",2,0.6666666666666666',
        '"k0000001",3,1',
        '"k0000002",4,1.3333333333333333',
    ]
    read = pacsv.read_csv(io.BytesIO(sink.getvalue()))
    assert read["count"].to_pylist() == list(range(5))


def test_an_empty_result_is_a_readable_file_with_the_columns() -> None:
    table = result_table(2).slice(0, 0)
    for fmt in ("parquet", "csv"):
        sink = io.BytesIO()
        assert write_data(table, fmt, sink).rows == 0
    assert pq.read_table(io.BytesIO(write_sink(table, "parquet"))).schema == table.schema


def write_sink(table: pa.Table, fmt: str) -> bytes:
    sink = io.BytesIO()
    write_data(table, fmt, sink)
    return sink.getvalue()


def test_key_columns_are_plain_strings_whatever_the_engine_held() -> None:
    keys = pa.array(["b", None, "a"], pa.large_string())
    table = pa.table({"k": keys, "j": keys.dictionary_encode(), "count": pa.array([1, 2, 3], pa.int64())})
    for fmt in ("parquet", "csv"):
        written = write_data(table, fmt, io.BytesIO())
        assert written.columns == (("k", "string"), ("j", "string"), ("count", "int64"))
    read = pq.read_table(io.BytesIO(write_sink(table, "parquet")))
    assert read.schema.field("j").type == pa.string() and read["j"].to_pylist() == ["b", None, "a"]


def test_the_writer_refuses_other_formats_and_empty_batches() -> None:
    with pytest.raises(ValueError, match="not a data format: 'json'"):
        write_data(result_table(3), "json", io.BytesIO())
    with pytest.raises(ValueError, match="batch_rows must be at least 1"):
        write_data(result_table(3), "csv", io.BytesIO(), batch_rows=0)


def test_the_writer_never_hands_the_sink_the_whole_file() -> None:
    class Counting(io.RawIOBase):
        def __init__(self) -> None:
            super().__init__()
            self.sizes: list[int] = []

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            self.sizes.append(memoryview(data).nbytes)
            return self.sizes[-1]

    table = result_table(200_000)
    for fmt in ("parquet", "csv"):
        sink = Counting()
        write_data(table, fmt, sink, batch_rows=10_000)
        assert len(sink.sizes) > 20 and max(sink.sizes) < sum(sink.sizes) / 10, fmt


# --- the staged writer ---------------------------------------------------------------------------


def staged(account: MemoryAccount, name: str, block_bytes: int) -> StagedBlobWriter:
    return account.blobs("results").writer(name, "text/csv", block_bytes)


def test_staged_writes_go_up_a_block_at_a_time_and_appear_at_the_commit() -> None:
    account = MemoryAccount()
    account.blobs("results").create()
    writer = staged(account, "a.csv", block_bytes=4)
    for part in (b"ab", b"cdefghij", b"k"):
        writer.write(part)
    assert writer.blocks == 2 and writer.tell() == 11  # 'abcd', 'efgh' staged; 'ijk' held
    assert "a.csv" not in account.containers["results"].blobs
    assert writer.commit() == 11
    stored = account.containers["results"].blobs["a.csv"]
    assert stored.data == b"abcdefghijk" and stored.content_type == "text/csv"
    assert [i for i, _ in stored.blocks] == [block_id(0), block_id(1), block_id(2)]
    with pytest.raises(ValueError, match="written after its commit"):
        writer.write(b"x")
    puts = [r for r in account.requests if "a.csv" in r]
    assert puts == ["PUT /devstoreaccount1/results/a.csv?comp=block"] * 3 + [
        "PUT /devstoreaccount1/results/a.csv?comp=blocklist"
    ]


def test_a_retried_write_replaces_the_blob_whole() -> None:
    account = MemoryAccount()
    account.blobs("results").create()
    first = staged(account, "r.csv", block_bytes=3)
    first.write(b"0123456789")
    first.commit()
    given_up = staged(account, "r.csv", block_bytes=3)
    given_up.write(b"abcdefgh")  # two blocks staged, then the run dies: never committed
    given_up.close()
    assert account.containers["results"].blobs["r.csv"].data == b"0123456789"
    retry = staged(account, "r.csv", block_bytes=3)
    retry.write(b"abcd")
    retry.commit()
    assert account.containers["results"].blobs["r.csv"].data == b"abcd"
    assert account.containers["results"].staged == {}  # what the dead run staged is dropped
    empty = staged(account, "e.csv", block_bytes=3)
    assert empty.commit() == 0 and account.containers["results"].blobs["e.csv"].data == b""


def test_a_storage_error_leaves_translated() -> None:
    account = MemoryAccount()  # no container: the first Put Block fails
    writer = staged(account, "x.csv", block_bytes=2)
    with pytest.raises(StorageError, match=r"^staging block 0 of results/x.csv: ContainerNotFound"):
        writer.write(b"abc")


# --- the data result's document ------------------------------------------------------------------


def test_the_document_names_the_data_blob() -> None:
    account = MemoryAccount()
    account.blobs("results").create()
    payload = {**BASE, "output": {"format": "parquet"}}
    table = result_table(1000)
    outcome = write_data_result(
        ctx_on(account, payload),
        parse_aggregate_payload(payload),
        ResultRows(5000, table=table),
        0.5,
        batch_rows=300,
        block_bytes=1024,
    )
    blobs = account.containers["results"].blobs
    size = len(blobs["job-7.v0.parquet"].data)
    assert outcome == Completed(
        result_ref="results/job-7.json",
        summary={
            "input_rows": 5000,
            "groups": 1000,
            "engine": "inline",
            "output": {"format": "parquet", "result_ref": "results/job-7.v0.parquet", "bytes": size},
        },
    )
    document = json.loads(blobs["job-7.json"].data)
    assert document == {
        "id": "job-7",
        "output": {
            "format": "parquet",
            "result_ref": "results/job-7.v0.parquet",
            "rows": 1000,
            "bytes": size,
            "columns": [
                {"name": "k", "type": "string"},
                {"name": "count", "type": "int64"},
                {"name": "sum_v", "type": "double"},
            ],
        },
        "input_rows": 5000,
        "engine": "inline",
        "elapsed_s": 0.5,
    }
    assert is_result_of(document, "job-7") and not is_result_of(document, "job-8")
    assert not is_result_of({"id": "job-7", "output": "x"}, "job-7")
    assert pq.read_table(io.BytesIO(blobs["job-7.v0.parquet"].data)).equals(table)
    assert len(blobs["job-7.v0.parquet"].blocks) > 1  # staged in blocks of 1 KiB
    edited = ctx_on(account, payload, version=1)
    write_data_result(edited, parse_aggregate_payload(payload), ResultRows(5000, table=table), 0.5)
    assert json.loads(blobs["job-7.json"].data)["output"]["result_ref"] == "results/job-7.v1.parquet"


def test_the_cli_tail_shows_a_data_outputs_groups_and_blob(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from shared.interfaces.cli import cmd_tail
    from tests.handlerkit import kit_runtime

    kit = kit_runtime()
    results = kit.account.blobs(kit.rt.settings.results_container)
    output = {"format": "csv", "result_ref": "results/j1.v0.csv", "rows": 42, "bytes": 10, "columns": []}
    results.write("j1.json", json.dumps({"id": "j1", "output": output, "input_rows": 99, "engine": "inline"}))
    results.write("j2.json", json.dumps({"id": "j2", "rows": [{}, {}], "input_rows": 5, "engine": "inline"}))
    args = argparse.Namespace(from_start=True, once=True, interval=0.0)
    assert cmd_tail(kit.rt, args) == 0
    assert capsys.readouterr().out.splitlines() == [
        "j1\tinline\t99 rows in\t42 groups out\tcsv: results/j1.v0.csv",
        "j2\tinline\t5 rows in\t2 groups out",
    ]
