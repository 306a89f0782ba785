"""Pick the configured backend (one instance per distinct configuration, shared by invocations)."""

from __future__ import annotations

import threading

from shared.errors import NotAvailable
from shared.settings import Settings, SparkSettings
from shared.spark.model import SparkBackend

_lock = threading.Lock()
_cache: dict[tuple[object, ...], SparkBackend] = {}


def make_backend(spark: SparkSettings) -> SparkBackend:
    """A new backend for these settings; NotAvailable when SPARK_BACKEND is none."""
    if spark.backend == "standalone":
        from shared.spark.standalone import StandaloneBackend

        return StandaloneBackend(spark)
    if spark.backend == "livy":
        from shared.spark.livy import LivyBackend

        return LivyBackend(spark)
    if spark.backend == "databricks":
        from shared.spark.databricks import DatabricksBackend

        return DatabricksBackend(spark)
    raise NotAvailable(
        "engine 'spark' is not available: SPARK_BACKEND is not set (standalone, livy or databricks)"
    )


def backend_for(settings: Settings) -> SparkBackend:
    """The backend of `settings.spark`, built once per configuration."""
    spark = settings.spark
    key = (
        spark.backend,
        spark.url,
        spark.connect_timeout_s,
        spark.read_timeout_s,
        tuple(sorted(spark.extra.items())),
    )
    with _lock:
        backend = _cache.get(key)
        if backend is None:
            backend = make_backend(spark)
            _cache[key] = backend
        return backend
