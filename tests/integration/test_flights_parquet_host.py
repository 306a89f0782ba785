"""The public NYC flights data as Parquet through the local Functions host (issue 37): a job
POSTed to the API over the blob on Azurite gives the published flights per carrier and pyarrow's
own mean arrival delay per carrier."""

from __future__ import annotations

from collections.abc import Callable

from azure.storage.blob import BlobServiceClient

from devstack.azurite import Azurite
from devstack.hostproc import HostProcess
from tests import nycflights
from tests.integration.helpers import unique
from tests.integration.test_e2e_host import call, start_host, wait_status

__all__ = ["start_host"]  # the fixture, shared with the other end-to-end tests


def test_flights_as_parquet_give_the_published_table(
    azurite: Azurite, start_host: Callable[..., HostProcess]
) -> None:
    table = nycflights.flights_table()
    container = unique("flights")
    blobs = BlobServiceClient.from_connection_string(azurite.connection_string).get_container_client(
        container
    )
    blobs.create_container()
    blobs.upload_blob("2013/flights.parquet", nycflights.flights_parquet(table))
    host = start_host()

    body = nycflights.payload(f"{container}/2013/flights.parquet", "inline")
    assert call(host, "POST", "jobs", {"id": "flights-1", "kind": "aggregate", "payload": body})[0] == 202
    wait_status(host, "flights-1", {"completed"}, timeout_s=120)
    status, result = call(host, "GET", "jobs/flights-1/result")
    assert status == 200 and result["input_rows"] == nycflights.ROWS, result
    assert result["engine"] == "inline"
    nycflights.check_rows(result["rows"], table)
