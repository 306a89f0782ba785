"""The public NYC flights data as Parquet on the local Spark cluster reading Azurite (issue 37):
the published flights per carrier, pyarrow's own mean arrival delay per carrier, and the inline
engine's rows."""

from __future__ import annotations

import io
import json

import pytest

from devstack.azurite import Azurite
from devstack.spark_cluster import SparkCluster
from shared.aggregation import aggregate_stream, parse_aggregate_payload
from shared.jobs.base import Completed
from shared.jobs.offload.aggregate_spark import offload
from shared.spark.backends import make_backend
from tests import nycflights
from tests.spark.helpers import assert_rows_equal, follow, make_ctx, settings_for, storage_for, upload

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_flights_as_parquet_on_spark_give_the_published_table_and_the_inline_rows(
    azurite: Azurite, spark_cluster: SparkCluster
) -> None:
    table = nycflights.flights_table()
    data = nycflights.flights_parquet(table)
    settings = settings_for(azurite, spark_cluster.env(), SPARK_SPLIT_MB="1", SPARK_MAX_SUBMISSIONS="2")
    storage = storage_for(settings)
    body = nycflights.payload(upload(storage, "flights", "2013/flights.parquet", data), "spark")
    ctx = make_ctx(settings, storage, body)
    done, _ = follow(ctx, offload(ctx), make_backend(settings.spark))
    assert isinstance(done, Completed) and done.summary["engine"] == "spark"
    blob = storage.blob.get_blob_client(settings.results_container, f"{ctx.job_id}.json")
    doc = json.loads(blob.download_blob().readall())
    assert doc["input_rows"] == nycflights.ROWS
    nycflights.check_rows(doc["rows"], table)
    inline = aggregate_stream(io.BytesIO(data), parse_aggregate_payload(body | {"engine": "inline"}))
    assert inline.input_rows == nycflights.ROWS
    assert_rows_equal(doc["rows"], inline.rows)
