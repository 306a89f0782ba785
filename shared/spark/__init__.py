"""The Spark backend layer: submit a run over HTTP, check it, find it again, cancel it.

- `model`: the `SparkBackend` interface and the values it passes.
- `backends`: the table of backends (`BACKENDS`: name -> class, settings, state mapping),
  settings read and checked at start-up, `backend_for(spark)`.
- `standalone`, `livy`, `databricks`, `fabric`: the backends, each with its typed settings.
- `tracking`: the pure lifecycle decision; `offload`: follow a run to completion.

Nothing is imported here, so that `shared.config.settings` can read the backend table.
"""
