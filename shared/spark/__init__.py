"""Hand large jobs to Spark over HTTP and track them to completion without waiting.

Public API:
- `offload(ctx, spec=None) -> Completed | Continue` and `resume(ctx, spec=None) -> Completed | Continue`
  (shared.spark.offload): what the aggregate handler calls.
- `SparkBackend` (submit / status / find / cancel) with `StandaloneBackend`, `LivyBackend`,
  `DatabricksBackend`; `backend_for(settings)` picks the configured one.
- `tracking.decide`: the pure lifecycle decision.
"""

from __future__ import annotations

from shared.spark.backends import backend_for, make_backend
from shared.spark.model import RunStatus, SparkBackend, SparkJobRequest, Submission
from shared.spark.offload import abandon, build_request, offload, resume

__all__ = [
    "RunStatus",
    "SparkBackend",
    "SparkJobRequest",
    "Submission",
    "abandon",
    "backend_for",
    "build_request",
    "make_backend",
    "offload",
    "resume",
]
