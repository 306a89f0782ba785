"""Fixtures for the Spark tests: one real standalone cluster per session (started on demand)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.spark_cluster import SparkCluster, java_ok, start_cluster


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    """A master + worker from the pyspark wheel on free loopback ports (4 advertised cores)."""
    if not java_ok():
        pytest.skip("Spark 4 needs Java 17+ on PATH")
    cluster = start_cluster(cores=4, memory="4g")
    try:
        yield cluster
    finally:
        cluster.cleanup()
