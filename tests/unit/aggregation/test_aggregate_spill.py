"""Groups spilled to sorted runs on disk (`shared.aggregation.spill`, issue 37): a result written
as data of any number of groups in bounded memory, the same rows as the in-memory engine's."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from shared.aggregation import (
    TooManyGroups,
    aggregate_rows,
    aggregate_table,
    blocks,
    csv_path,
    parse_aggregate_payload,
)
from shared.aggregation.blocks import narrow_blocks
from shared.aggregation.options import MANY_GROUPS, NARROW_BLOCK_SIZE, EngineOptions
from shared.aggregation.spill import RunWriter, SpillLimits, key_at, range_bounds
from shared.jobs.aggregate_output import write_data_result
from shared.storage.memory_account import MemoryAccount
from tests.unit.aggregation.aggregate_support import ctx_on

METRICS = [
    {"op": "count"},
    {"op": "count", "column": "v"},
    {"op": "sum", "column": "v"},
    {"op": "mean", "column": "v"},
    {"op": "min", "column": "v"},
    {"op": "max", "column": "v"},
]
SMALL = EngineOptions(block_size=2048, combine_rows=64)
TINY_LIMITS = [
    SpillLimits(spill_rows=40, batch_rows=7, range_rows=50, max_runs=3),
    SpillLimits(spill_rows=8, batch_rows=2, range_rows=4, max_runs=2),
    SpillLimits(spill_rows=300, batch_rows=64, range_rows=500, max_runs=16),
]


def spec_for(fmt: str = "csv", group_by: tuple[str, ...] = ("a", "b")) -> Any:
    payload = {
        "input": "data/x." + fmt,
        "format": fmt,
        "group_by": list(group_by),
        "metrics": METRICS,
        "output": {"format": "parquet"},
    }
    return parse_aggregate_payload(payload)


def rows_of(seed: int, n: int) -> list[tuple[str, str, str]]:
    """(a, b, v) as written: empty and NA keys (nulls), non-ASCII ones, values missing; sums of
    these values are exact whatever the order the partials are combined in."""
    rng = random.Random(seed)
    firsts = ["", "NA", "x", "é", "Z", "zz", "a\u00ff", "日本", "\U0001f600", "A"]
    return [
        (
            rng.choice(firsts) + str(rng.randint(0, 150)) * rng.randint(0, 1),
            rng.choice(["", "NA", "q", "r", "Ω"]),
            rng.choice(["", "1.5", "2", "-3.25", "1024", "0.125"]),  # sums exact in any order
        )
        for _ in range(n)
    ]


def csv_bytes(rows: list[tuple[str, str, str]]) -> bytes:
    return ("a,b,v\n" + "".join(f"{a},{b},{v}\n" for a, b, v in rows)).encode()


def jsonl_bytes(rows: list[tuple[str, str, str]]) -> bytes:
    lines = []
    for a, b, v in rows:
        record: dict[str, Any] = {"a": None if a in ("", "NA") else a, "b": None if b in ("", "NA") else b}
        record["v"] = float(v) if v else None
        lines.append(json.dumps(record, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode()


def collected(result: Any, batch_rows: int = 100) -> pa.Table:
    return pa.Table.from_batches(list(result.batches(batch_rows)), result.schema)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("limits", TINY_LIMITS)
def test_spilled_rows_are_the_in_memory_engines(fmt: str, limits: SpillLimits, tmp_path: Path) -> None:
    rows = rows_of(7, 1500)
    data = csv_bytes(rows) if fmt == "csv" else jsonl_bytes(rows)
    spec = spec_for(fmt)
    expected, input_rows = aggregate_table(io.BytesIO(data), spec, options=SMALL)
    limits = SpillLimits(
        limits.spill_rows, limits.batch_rows, limits.range_rows, limits.max_runs, str(tmp_path)
    )
    with aggregate_rows(io.BytesIO(data), spec, options=SMALL, limits=limits) as result:
        assert result.spilled is not None
        assert list(tmp_path.iterdir())  # the runs' folder
        assert (result.groups, result.input_rows) == (expected.num_rows, input_rows)
        assert result.schema == expected.schema
        got = collected(result, batch_rows=37)
        assert [b.num_rows for b in result.batches(37)][:-1] == [37] * (-(-got.num_rows // 37) - 1)
    assert got.to_pylist() == expected.to_pylist()
    assert not list(tmp_path.iterdir())  # closed: removed


def test_few_groups_stay_in_memory(tmp_path: Path) -> None:
    data = csv_bytes([("a", "b", "1"), ("a", "", "2"), ("c", "b", "")])
    limits = SpillLimits(directory=str(tmp_path))
    with aggregate_rows(io.BytesIO(data), spec_for(), limits=limits) as result:
        assert result.spilled is None and result.groups == 3 and result.input_rows == 3
        assert collected(result).equals(aggregate_table(io.BytesIO(data), spec_for())[0])
    assert not list(tmp_path.iterdir())


def test_an_empty_input_gives_no_rows() -> None:
    with aggregate_rows(io.BytesIO(b"a,b,v\n"), spec_for()) as result:
        assert (result.groups, result.input_rows) == (0, 0)
        assert collected(result).num_rows == 0


@pytest.mark.parametrize("limits", TINY_LIMITS[:2])
def test_more_groups_than_max_groups_stop_and_leave_no_files(limits: SpillLimits, tmp_path: Path) -> None:
    data = csv_bytes([(f"k{i}", "b", "1") for i in range(600)])
    limits = SpillLimits(
        limits.spill_rows, limits.batch_rows, limits.range_rows, limits.max_runs, str(tmp_path)
    )
    with pytest.raises(TooManyGroups) as stopped:
        aggregate_rows(io.BytesIO(data), spec_for(), max_groups=200, options=SMALL, limits=limits)
    assert stopped.value.limit == 200 and stopped.value.seen > 200
    assert not list(tmp_path.iterdir())
    with aggregate_rows(io.BytesIO(data), spec_for(), max_groups=600, options=SMALL, limits=limits) as result:
        assert result.groups == 600


def test_python_keys_order_as_arrow_sorts(tmp_path: Path) -> None:
    """Runs are cut by Python's key order: it must be the result's (nulls first, UTF-8 bytes)."""
    rng = random.Random(3)
    alphabet = ["", "a", "B", "é", "日", "\U0001f600", "\x7f", "z", "\u00ff", "A"]
    firsts = [rng.choice([None, *alphabet]) for _ in range(2000)]
    seconds = [rng.choice([None, "", "x", "ÿ"]) for _ in range(2000)]
    table = pa.table({"k0": pa.array(firsts, pa.string()), "k1": pa.array(seconds, pa.string())})
    order = pc.sort_indices(
        table, sort_keys=[("k0", "ascending", "at_start"), ("k1", "ascending", "at_start")]
    )
    arrow = table.take(order).to_batches()[0]
    keys = [key_at(arrow, ["k0", "k1"], i) for i in range(arrow.num_rows)]
    assert keys == sorted(keys)


def test_range_bounds_cut_near_the_rows_asked_for(tmp_path: Path) -> None:
    keys = sorted(f"k{i:05d}" for i in range(1000))
    runs = []
    for r in range(3):
        table = pa.table({"k0": pa.array(keys[r::3], pa.string())})
        writer = RunWriter(tmp_path / f"{r}.arrow", table.schema, ["k0"], 10)
        writer.write(table)
        runs.append(writer.close())
    bounds = range_bounds(runs, 100)
    assert bounds == sorted(set(bounds)) and 8 <= len(bounds) <= 10
    assert range_bounds(runs, 10_000) == []


def test_blocks_narrow_past_many_groups_and_widen_back() -> None:
    wide = 8 * 1024 * 1024
    assert not narrow_blocks(MANY_GROUPS, wide, wide, narrowed=False)
    assert narrow_blocks(MANY_GROUPS + 1, wide, wide, narrowed=False)
    assert narrow_blocks(MANY_GROUPS // 8 + 1, 1024 * 1024, wide, narrowed=True)  # 8x the bytes
    assert not narrow_blocks(MANY_GROUPS // 8, 1024 * 1024, wide, narrowed=True)


def test_a_spilled_result_is_written_as_parquet(tmp_path: Path) -> None:
    account = MemoryAccount()
    account.blobs("results").create()
    data = csv_bytes(rows_of(11, 1500))
    spec = spec_for()
    payload: dict[str, Any] = {"input": "data/x.csv", "format": "csv", "group_by": ["a", "b"]}
    payload.update(metrics=METRICS, output={"format": "parquet"})
    ctx = ctx_on(account, payload, job_id="job-9")
    expected, _ = aggregate_table(io.BytesIO(data), spec, options=SMALL)
    limits = SpillLimits(spill_rows=50, batch_rows=16, range_rows=64, max_runs=4, directory=str(tmp_path))
    with aggregate_rows(io.BytesIO(data), spec, options=SMALL, limits=limits) as result:
        assert result.spilled is not None
        outcome = write_data_result(ctx, spec, result, 0.1, batch_rows=100)
    assert outcome.summary["groups"] == expected.num_rows
    written = pq.read_table(io.BytesIO(account.containers["results"].blobs["job-9.v0.parquet"].data))
    assert written.equals(expected)
    assert pq.ParquetFile(
        io.BytesIO(account.containers["results"].blobs["job-9.v0.parquet"].data)
    ).metadata.row_group(0).num_rows == min(100, expected.num_rows)


class Chunks(io.RawIOBase):
    """Bytes handed out in place, `chunk` at a time (as the blob reader does)."""

    def __init__(self, data: bytes, chunk: int) -> None:
        super().__init__()
        self.data, self.chunk, self.pos = data, chunk, 0

    def next_chunk(self) -> tuple[bytearray, int, int] | None:
        if self.pos >= len(self.data):
            return None
        piece = self.data[self.pos : self.pos + self.chunk]
        self.pos += len(piece)
        return bytearray(piece), 0, len(piece)

    def give_back(self, buf: bytearray) -> None:
        buf[:] = b"x" * len(buf)  # a block still parsed would see this

    def readable(self) -> bool:
        return True


def test_an_in_place_splitter_fits_its_blocks_to_the_groups() -> None:
    splitter = blocks.InPlaceSplitter(Chunks(b"", 10), 1 << 22, csv_path.record_cut, "a CSV record", 1 << 24)
    splitter.whole_buffers = True
    splitter.fit(MANY_GROUPS, 8 << 20)
    assert (splitter.size, splitter.whole_buffers, splitter.narrowed) == (1 << 22, True, False)
    splitter.fit(MANY_GROUPS + 1, 8 << 20)
    assert (splitter.size, splitter.whole_buffers, splitter.narrowed) == (NARROW_BLOCK_SIZE, False, True)
    splitter.fit(10, 1 << 20)
    assert (splitter.size, splitter.whole_buffers, splitter.narrowed) == (1 << 22, True, False)
    splitter.start_narrow()
    assert (splitter.size, splitter.whole_buffers, splitter.narrowed) == (NARROW_BLOCK_SIZE, False, True)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_blocks_of_many_groups_are_narrowed_with_the_same_answer(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[blocks.Splitter] = []
    over = blocks.Splitter.over

    def recording_over(*args: Any) -> blocks.Splitter:
        made.append(over(*args))
        return made[-1]

    monkeypatch.setattr(blocks.Splitter, "over", staticmethod(recording_over))
    keys = [(f"{i * 7919 % 100_003:06d}", "b", "2") for i in range(2 * MANY_GROUPS + 5000)]
    data = csv_bytes(keys) if fmt == "csv" else jsonl_bytes(keys)
    spec = spec_for(fmt)
    options = EngineOptions(block_size=1 << 20)
    expected, _ = aggregate_table(io.BytesIO(data), spec, options=options)
    table, _ = aggregate_table(Chunks(data, len(data) // 2 + 1), spec, options=options)
    assert table.equals(expected) and not made[-1].narrowed  # the JSON document's runs: as shipped
    fitted = EngineOptions(block_size=1 << 20, fit_blocks=True)
    table, _ = aggregate_table(Chunks(data, len(data) // 2 + 1), spec, options=fitted)
    assert table.equals(expected)
    assert made[-1].narrowed and not made[-1].whole_buffers  # a block held more than MANY_GROUPS
    with aggregate_rows(Chunks(data, 200_000), spec, options=options) as result:  # narrow from the start
        assert made[-1].narrowed
        assert collected(result, 10_000).equals(expected)
