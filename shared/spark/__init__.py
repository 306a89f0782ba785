"""The Spark backend layer: submit a run over HTTP, check it, find it again, cancel it.

- `model`: the `SparkBackend` interface and the values it passes.
- `backends`: the table of backends (`BACKENDS`: name -> class, settings, state mapping),
  settings read and checked at start-up, `backend_for(spark)`.
- `standalone`, `livy`, `databricks`, `fabric`: the backends, each with its typed settings.
- `transport`: the backends' HTTP calls (timeouts, Retry-After, scrubbed errors).
- `tracking`: the pure lifecycle decision; `states`: each backend's states mapped to one set;
  `slots`: the SPARK_MAX_CONCURRENT_RUNS slots.
Following a run to completion is the offload's (`shared.jobs.offload`), above this layer.

Nothing is imported here, so that `shared.config.settings` can read the backend table.
"""
