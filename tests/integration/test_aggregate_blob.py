"""The aggregate handler end to end against a real Azurite: blob in, result document out."""

from __future__ import annotations

import csv
import io
import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient

from devstack import datagen
from devstack.azurite import Azurite
from shared.aggregation import EngineOptions, aggregate_stream, csv_path, parse_aggregate_payload
from shared.aggregation.native import NATIVE
from shared.blobio.reader import open_blob_stream
from shared.config.settings import Settings
from shared.core.errors import InputDataError, InputMissing
from shared.jobs.aggregate import HANDLER
from shared.jobs.base import Completed, JobContext
from shared.storage.accounts import AzureAccount
from shared.storage.clients import StorageClients, clients_for

pytestmark = pytest.mark.integration


@dataclass
class Env:
    settings: Settings
    storage: StorageClients
    data: str
    checkpoints: list[Any]

    def ctx(self, payload: dict[str, Any], job_id: str | None = None) -> JobContext:
        return JobContext(
            job_id=job_id or f"agg-{uuid.uuid4().hex[:8]}",
            kind="aggregate",
            attempt=1,
            payload=payload,
            settings=self.settings,
            storage=AzureAccount(self.storage, self.settings.storage),
            log=logging.LoggerAdapter(logging.getLogger("test.aggregate"), {}),
            checkpoint=self.checkpoints.append,
        )

    def upload(self, name: str, data: bytes) -> None:
        self.storage.blob.get_blob_client(self.data, name).upload_blob(data, overwrite=True)

    def result(self, ref: str) -> dict[str, Any]:
        container, _, name = ref.partition("/")
        raw = self.storage.blob.get_blob_client(container, name).download_blob().readall()
        document: dict[str, Any] = json.loads(raw)
        return document


@pytest.fixture
def env(azurite: Azurite) -> Iterator[Env]:
    suffix = uuid.uuid4().hex[:10]
    settings = Settings.from_env(
        {"AzureWebJobsStorage": azurite.connection_string, "RESULTS_CONTAINER": f"results{suffix}"}
    )
    storage = clients_for(settings.storage)
    service: BlobServiceClient = storage.blob
    data = f"data{suffix}"
    service.create_container(data)  # containers exist at start-up; the handler never creates them
    service.create_container(settings.results_container)
    yield Env(settings, storage, data, [])
    service.delete_container(data)
    service.delete_container(settings.results_container)


def independent(text: str) -> tuple[int, dict[tuple[str | None, str], list[Any]]]:
    """count, sum(qty), mean(price) per (region, product) with the csv module alone."""
    groups: dict[tuple[str | None, str], list[Any]] = {}
    rows = 0
    for row in csv.DictReader(io.StringIO(text, newline="")):
        rows += 1
        region = None if row["region"] in ("", "NA") else row["region"]
        acc = groups.setdefault((region, row["product"]), [0, 0.0, 0, 0.0, 0])
        acc[0] += 1
        if row["qty"] not in ("", "NA"):
            acc[1] += float(row["qty"])
            acc[2] += 1
        if row["price"] not in ("", "NA"):
            acc[3] += float(row["price"])
            acc[4] += 1
    return rows, groups


def test_handler_end_to_end(env: Env) -> None:
    text = "".join(datagen.csv_lines(20_000, seed=5))
    env.upload("2024/sales.csv", text.encode())
    payload = {
        "input": f"{env.data}/2024/sales.csv",
        "format": "csv",
        "group_by": ["region", "product"],
        "metrics": [
            {"op": "count"},
            {"op": "sum", "column": "qty"},
            {"op": "mean", "column": "price", "as": "avg"},
        ],
    }
    ctx = env.ctx(payload, job_id="agg-e2e-1")
    outcome = HANDLER.run(ctx)

    rows, groups = independent(text)
    assert outcome == Completed(
        result_ref=f"{env.settings.results_container}/agg-e2e-1.json",
        summary={"input_rows": rows, "groups": len(groups), "engine": "inline"},
    )
    document = env.result(outcome.result_ref)
    assert set(document) == {"id", "rows", "input_rows", "engine", "elapsed_s"}
    assert document["id"] == "agg-e2e-1" and document["engine"] == "inline" and document["input_rows"] == rows
    keys = [(r["region"], r["product"]) for r in document["rows"]]
    assert keys == sorted(groups, key=lambda k: (k[0] is not None, k[0] or "", k[1]))
    for row in document["rows"]:
        count, qty_sum, qty_n, price_sum, price_n = groups[(row["region"], row["product"])]
        assert list(row) == ["region", "product", "count", "sum_qty", "avg"]
        assert row["count"] == count
        assert row["sum_qty"] == pytest.approx(qty_sum, rel=1e-9) if qty_n else row["sum_qty"] is None
        assert row["avg"] == pytest.approx(price_sum / price_n, rel=1e-9) if price_n else row["avg"] is None

    again = HANDLER.run(ctx)  # a second run of the same job id writes the same blob again
    assert isinstance(again, Completed)
    assert again.result_ref == outcome.result_ref
    assert env.result(again.result_ref)["rows"] == document["rows"]
    names = [
        b.name for b in env.storage.blob.get_container_client(env.settings.results_container).list_blobs()
    ]
    assert names == ["agg-e2e-1.json"]
    assert env.checkpoints == []


def test_jsonl_end_to_end(env: Env) -> None:
    env.upload("lines.jsonl", "".join(datagen.jsonl_lines(3000, seed=2)).encode())
    payload = {
        "input": f"{env.data}/lines.jsonl",
        "format": "jsonl",
        "group_by": ["channel"],
        "metrics": [{"op": "count"}, {"op": "max", "column": "qty"}],
    }
    outcome = HANDLER.run(env.ctx(payload))
    assert isinstance(outcome, Completed)
    document = env.result(outcome.result_ref)
    assert [r["channel"] for r in document["rows"]] == sorted(datagen.CHANNELS)
    assert sum(r["count"] for r in document["rows"]) == document["input_rows"] == 3000
    assert all(r["max_qty"] == 50.0 for r in document["rows"])


def test_missing_input_blob_and_container(env: Env) -> None:
    payload = {"input": f"{env.data}/nope.csv", "format": "csv", "metrics": [{"op": "count"}]}
    with pytest.raises(InputMissing, match=f"input {env.data}/nope.csv does not exist"):
        HANDLER.run(env.ctx(payload))
    with pytest.raises(InputMissing, match="container not found"):
        HANDLER.run(env.ctx({**payload, "input": "no-such-container/x.csv"}))


def test_bad_values_in_a_large_blob_name_the_exact_line(env: Env) -> None:
    good = "".join(datagen.csv_lines(60_000, seed=9))
    bad_row = "10999999,2024-01-01T00:00:00,north,DE,S0001,P0001,garden,C0000001,web,7,abc,0.0,EUR,\n"
    env.upload("bad.csv", (good + bad_row).encode())
    env.upload("ragged.csv", (good + "a,b,c\n").encode())
    line = good.count("\n") + 1
    payload: dict[str, Any] = {
        "input": f"{env.data}/bad.csv",
        "format": "csv",
        "group_by": ["region"],
        "metrics": [{"op": "sum", "column": "price"}],
    }
    expected = f"column 'price' has a value that is not a number on line {line}: 'abc'"
    with pytest.raises(InputDataError, match=f"^{expected}$"):
        HANDLER.run(env.ctx(payload))
    # Many blocks: the line is found by reading the blob again up to the failing block.
    blob = env.storage.blob.get_blob_client(env.data, "bad.csv")
    spec = parse_aggregate_payload(payload)
    with (
        pytest.raises(InputDataError, match=f"^{expected}$"),
        open_blob_stream(blob, chunk_size=100_000) as stream,
    ):
        aggregate_stream(stream, spec, options=EngineOptions(block_size=256 * 1024))
    spec = parse_aggregate_payload({**payload, "metrics": [{"op": "count"}]})
    ragged = f"CSV input is not valid on line {line}: Expected 14 columns, got 3: a,b,c"
    blob = env.storage.blob.get_blob_client(env.data, "ragged.csv")
    with (
        pytest.raises(InputDataError, match=f"^{ragged}$"),
        open_blob_stream(blob, chunk_size=100_000) as stream,
    ):
        aggregate_stream(stream, spec, options=EngineOptions(block_size=256 * 1024))


def test_empty_blob_and_multi_chunk_stream(env: Env) -> None:
    env.upload("empty.csv", b"")
    payload = {"input": f"{env.data}/empty.csv", "format": "csv", "metrics": [{"op": "count"}]}
    with pytest.raises(InputDataError, match="the input is empty"):
        HANDLER.run(env.ctx(payload))
    data = bytes(range(256)) * 10_000
    env.upload("bin", data)
    blob = env.storage.blob.get_blob_client(env.data, "bin")
    with open_blob_stream(blob, chunk_size=100_000, max_concurrency=3) as stream:
        assert stream.size == len(data)
        assert stream.readall() == data


def count_seeks(stream: Any) -> list[int]:
    """The offsets `stream.seek` is called with from now on."""
    seeks: list[int] = []
    seek = stream.seek

    def counted(offset: int, whence: int = io.SEEK_SET) -> int:
        seeks.append(offset)
        return int(seek(offset, whence))

    stream.seek = counted
    return seeks


def test_quoted_line_breaks_over_the_blob_reader(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Values with line breaks in quotes, over the blob reader's GETs: a block cut inside one is
    cut again from its start, from a copy (no seek, no GET twice), and the answer is the csv
    module's."""
    rows = []
    for i in range(20_000):
        note = f'"line one\nline two, ""{i}""\nthree"' if i % 9 == 0 else "plain"
        rows.append(f"{'xyz'[i % 3]},{i % 11},{note}\n")
    text = "k,v,note\n" + "".join(rows)
    env.upload("multiline.csv", text.encode())
    expected: dict[str, list[float]] = {}
    for row in csv.DictReader(io.StringIO(text, newline="")):
        acc = expected.setdefault(row["k"], [0, 0.0])
        acc[0] += 1
        acc[1] += float(row["v"])
    spec = parse_aggregate_payload(
        {
            "input": f"{env.data}/multiline.csv",
            "format": "csv",
            "group_by": ["k"],
            "metrics": [{"op": "count", "as": "n"}, {"op": "sum", "column": "v", "as": "s"}],
        }
    )
    blob = env.storage.blob.get_blob_client(env.data, "multiline.csv")
    recuts: list[int] = []
    cut_again = csv_path.cut_again

    def counted(*args: Any, **kwargs: Any) -> Any:
        recuts.append(1)
        return cut_again(*args, **kwargs)

    monkeypatch.setattr(csv_path, "cut_again", counted)
    for speculative in (True, False):
        recuts.clear()
        with open_blob_stream(blob, chunk_size=100_000, max_concurrency=3) as stream:
            seeks = count_seeks(stream)
            options = EngineOptions(block_size=16 * 1024, speculative_cuts=speculative)
            result = aggregate_stream(stream, spec, options=options)
            assert stream.tell() == len(text.encode())
        assert seeks == [] and len(recuts) == (1 if speculative and NATIVE else 0), (seeks, recuts)
        assert result.input_rows == 20_000
        assert {r["k"]: [r["n"], r["s"]] for r in result.rows} == expected
