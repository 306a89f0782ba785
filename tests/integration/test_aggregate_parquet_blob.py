"""Parquet jobs through the pipeline on a real Azurite: a job over a Parquet blob completes with
the right table (read by ranged GETs: the footer and the needed column chunks), and a truncated
one is poisoned with its reason kept."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from devstack import parquetgen
from devstack.azurite import Azurite
from shared.pipeline.processing import process_message
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend
from tests.integration.helpers import message

pytestmark = [pytest.mark.integration, pytest.mark.azurite]


@pytest.fixture
def rt(azurite: Azurite) -> Runtime:
    return Backend.on_azurite(azurite).runtime()


def upload(rt: Runtime, name: str, data: bytes) -> str:
    container = f"data{uuid.uuid4().hex[:8]}"
    rt.account.blobs(container).create()
    rt.account.blobs(container).write(name, data)
    return f"{container}/{name}"


def job(job_id: str, source: str) -> dict[str, object]:
    return {
        "id": job_id,
        "kind": "aggregate",
        "payload": {
            "input": source,
            "format": "parquet",
            "group_by": ["kind", "station_id"],
            "metrics": [
                {"op": "count"},
                {"op": "sum", "column": "precip"},
                {"op": "mean", "column": "temp"},
                {"op": "max", "column": "humidity"},
            ],
            "engine": "inline",
        },
    }


def independent(table: pa.Table) -> dict[tuple[str, str], tuple[int, float, int | None]]:
    """count, sum(precip), max(humidity) per (kind, station_id): plain Python over the rows."""
    out: dict[tuple[str, str], tuple[int, float, int | None]] = {}
    for row in table.select(["kind", "station_id", "precip", "humidity"]).to_pylist():
        key = ("true" if row["kind"] else "false", str(row["station_id"]))
        count, total, top = out.get(key, (0, 0.0, None))
        humidity = row["humidity"]
        top = humidity if top is None or (humidity is not None and humidity > top) else top
        out[key] = (count + 1, total + (row["precip"] or 0.0), top)
    return out


def test_a_parquet_job_completes_with_the_right_table(rt: Runtime, tmp_path: Path) -> None:
    path = parquetgen.write(tmp_path / "w.parquet", rows=60_000, row_group=16_384)
    source = upload(rt, "2024/weather.parquet", path.read_bytes())
    process_message(message(job("pq-ok", source)), rt)
    record = rt.ledger.get("pq-ok")
    assert record is not None and record.status == "completed", record and record.data
    container, _, name = record.data["result_ref"].partition("/")
    document = json.loads(rt.account.blobs(container).read(name))
    assert document["input_rows"] == 60_000 and document["engine"] == "inline"
    reference = independent(pq.read_table(path))
    got = {(r["kind"], r["station_id"]): r for r in document["rows"]}
    assert got.keys() == reference.keys()
    for key, (count, total, top) in reference.items():
        assert got[key]["count"] == count and got[key]["max_humidity"] == top
        assert got[key]["sum_precip"] == pytest.approx(total, rel=1e-9)
    keys = [(r["kind"], r["station_id"]) for r in document["rows"]]
    assert keys == sorted(keys)


def test_a_truncated_parquet_blob_is_poisoned_with_its_reason(rt: Runtime) -> None:
    sink = io.BytesIO()
    pq.write_table(
        pa.table(
            {
                "kind": [True, False],
                "station_id": [1, 2],
                "precip": [0.5, 1.0],
                "temp": [1.0, 2.0],
                "humidity": [3, 4],
            }
        ),
        sink,
    )
    data = sink.getvalue()
    source = upload(rt, "cut.parquet", data[: len(data) // 2])
    process_message(message(job("pq-cut", source)), rt)
    record = rt.ledger.get("pq-cut")
    assert record is not None and record.status == "poisoned"
    assert record.data["reason"] == (
        "bad_input_data: the input does not end with Parquet's magic bytes 'PAR1': it is truncated, "
        "or not a Parquet file"
    )
