"""The C scanner on the executors, and CSV quoted line breaks across splits, on the real local cluster.

- the engine zip the driver builds from the checkout holds the scanner: the executors load it
  (the driver's log counts the tasks that did), and an input whose quoted values hold line
  breaks across many split starts gives the inline answer;
- an engine zip (SPARK_PY_FILES) whose scanner cannot load there: the executors parse on the
  Python path, the reason in the driver's log, and the answer is still the inline one.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from devstack import datagen
from devstack.azurite import Azurite
from devstack.spark_cluster import SparkCluster
from shared.jobs.base import Completed, Continue
from shared.jobs.offload.aggregate_spark import offload
from shared.spark.backends import make_backend
from spark_jobs.aggregate_job import build_engine_zip
from tests.spark.helpers import (
    assert_rows_equal,
    follow,
    inline_result,
    make_ctx,
    settings_for,
    storage_for,
    upload,
)
from tests.spark.test_job_splits import quoted_csv

pytestmark = [pytest.mark.spark, pytest.mark.integration]

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_job(
    azurite: Azurite, cluster: SparkCluster, data: bytes, payload: dict[str, Any], **extra: str
) -> tuple[list[dict[str, Any]], str]:
    """Offload one job, follow it to its result; (the rows, the driver's stdout)."""
    settings = settings_for(azurite, cluster.env(), **extra)
    storage = storage_for(settings)
    payload = {**payload, "input": upload(storage, "inputs", f"{id(data)}.csv", data), "engine": "spark"}
    ctx = make_ctx(settings, storage, payload)
    first = offload(ctx, backend=make_backend(settings.spark))
    assert isinstance(first, Continue)
    done, _ = follow(ctx, first, make_backend(settings.spark))
    assert isinstance(done, Completed)
    blob = storage.blob.get_blob_client(settings.results_container, f"{ctx.job_id}.json")
    doc = json.loads(blob.download_blob().readall())
    return doc["rows"], cluster.driver_log(str(first.state["submission_id"]), "stdout")


def test_the_scanner_is_shipped_and_quoted_line_breaks_across_splits_equal_inline(
    azurite: Azurite, spark_cluster: SparkCluster
) -> None:
    data = quoted_csv(4000, seed=9)
    payload = {"format": "csv", "group_by": ["k"],
               "metrics": [{"op": "count"}, {"op": "sum", "column": "v"}, {"op": "count", "column": "note"}]}  # fmt: skip
    rows, log = run_job(azurite, spark_cluster, data, payload, SPARK_SPLIT_MB="0.004")
    assert_rows_equal(rows, inline_result(data, {**payload, "input": "inputs/q.csv"}))
    assert "task(s): scanner " in log and "(shipped)" in log, log
    assert "python path" not in log, log


def test_a_shipped_scanner_that_cannot_load_leaves_the_python_path_with_the_reason(
    azurite: Azurite, spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    engine = build_engine_zip(
        REPO_ROOT, tmp_path / "engine.zip", ("aggkernel.cpython-311-arm.so", b"not ELF")
    )
    with zipfile.ZipFile(engine) as zf:
        assert zf.read("spark_jobs/native/aggkernel.txt") == b"aggkernel.cpython-311-arm.so"
    data = "".join(datagen.csv_lines(3000, seed=4)).encode()
    payload = {
        "format": "csv",
        "group_by": ["region"],
        "metrics": [{"op": "count"}, {"op": "mean", "column": "price"}],
    }
    rows, log = run_job(azurite, spark_cluster, data, payload, SPARK_PY_FILES=str(engine))
    assert_rows_equal(rows, inline_result(data, {**payload, "input": "inputs/s.csv"}))
    assert "task(s): python path (the shipped scanner does not load here: " in log, log
    assert "scanner x86" not in log, log
