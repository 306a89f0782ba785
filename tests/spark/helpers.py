"""Helpers for the Spark tests: a JobContext on Azurite, settings for a cluster, a polling loop."""

from __future__ import annotations

import contextlib
import io
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from azure.core.exceptions import ResourceExistsError

from devstack.azurite import Azurite
from shared.aggregation import aggregate_stream, parse_aggregate_payload
from shared.config.settings import Settings
from shared.jobs.base import Completed, Continue, JobContext, Outcome
from shared.jobs.offload.aggregate_spark import resume
from shared.spark.model import SparkBackend
from shared.storage.accounts import AzureAccount
from shared.storage.clients import StorageClients, clients_for

LOG = logging.getLogger("tests.spark")
PAYLOAD: dict[str, Any] = {
    "input": "data/in.csv",
    "format": "csv",
    "group_by": ["k"],
    "metrics": [{"op": "count"}],
    "engine": "spark",
}
"""The smallest aggregate payload that goes to Spark (the input is never read by the fakes)."""


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def settings_for(azurite: Azurite, spark_env: Mapping[str, str], **extra: str) -> Settings:
    env = {
        "AzureWebJobsStorage": azurite.connection_string,
        "RESULTS_CONTAINER": unique("results"),
        "LEDGER_CONTAINER": unique("ledger"),  # holds the SPARK_MAX_CONCURRENT_RUNS slots
        "SPARK_POLL_INITIAL_SECONDS": "5",
        "SPARK_POLL_MAX_SECONDS": "60",
        **spark_env,
        **extra,
    }
    return Settings.from_env(env)


@dataclass
class Checkpoints:
    """Records what a handler checkpoints (the ledger's job in production)."""

    saved: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, progress: Mapping[str, Any]) -> None:
        self.saved.append(dict(progress))

    @property
    def last(self) -> dict[str, Any] | None:
        return self.saved[-1] if self.saved else None


def make_ctx(
    settings: Settings,
    storage: StorageClients,
    payload: Mapping[str, Any],
    job_id: str | None = None,
    *,
    resume_state: Mapping[str, Any] | None = None,
    progress: Mapping[str, Any] | None = None,
    attempt: int = 0,
    checkpoints: Checkpoints | None = None,
) -> JobContext:
    job = job_id or unique("job-")
    return JobContext(
        job_id=job,
        kind="aggregate",
        attempt=attempt,
        payload=payload,
        settings=settings,
        storage=AzureAccount(storage, settings.storage),
        log=logging.LoggerAdapter(LOG, {"job_id": job}),
        checkpoint=checkpoints if checkpoints is not None else Checkpoints(),
        resume_state=resume_state,
        progress=progress,
    )


def storage_for(settings: Settings) -> StorageClients:
    clients = clients_for(settings.storage)
    for container in (settings.results_container, settings.ledger_container):
        with contextlib.suppress(ResourceExistsError):
            clients.blob.create_container(container)
    return clients


def upload(storage: StorageClients, container: str, name: str, data: bytes) -> str:
    with contextlib.suppress(ResourceExistsError):
        storage.blob.create_container(container)
    storage.blob.get_blob_client(container, name).upload_blob(data, overwrite=True)
    return f"{container}/{name}"


def follow(
    ctx: JobContext, outcome: Outcome, backend: SparkBackend, timeout_s: float = 180.0, every_s: float = 2.0
) -> tuple[Completed, list[dict[str, Any]]]:
    """Call resume() as continuation messages would (without waiting delay_s) until Completed."""
    states: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while isinstance(outcome, Continue):
        states.append(dict(outcome.state))
        if time.monotonic() > deadline:
            raise TimeoutError(f"still offloaded after {timeout_s:.0f}s: {outcome.state}")
        time.sleep(every_s)
        ctx.resume_state = outcome.state
        outcome = resume(ctx, backend=backend)
    return outcome, states


def inline_result(data: bytes, payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    return aggregate_stream(io.BytesIO(data), parse_aggregate_payload(payload)).rows


def assert_rows_equal(got: list[dict[str, Any]], want: list[dict[str, Any]], rel: float = 1e-9) -> None:
    """Keys and counts exact; floats within `rel` relative."""
    assert len(got) == len(want), (len(got), len(want))
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys(), (a, b)
        for key in a:
            x, y = a[key], b[key]
            if isinstance(y, float) and isinstance(x, float):
                assert abs(x - y) <= rel * max(abs(y), 1e-300), (key, x, y)
            else:
                assert x == y, (key, a, b)
