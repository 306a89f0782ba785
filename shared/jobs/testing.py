"""Fault-injection kinds for tests, the demo and chaos runs (only with ENABLE_TEST_KINDS=true)."""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

from shared.core.errors import DownstreamUnavailable, InputDataError, PayloadError
from shared.jobs.base import Completed, JobContext, Outcome
from shared.storage.failures import AlreadyExists

EFFECTS_PREFIX = "effects/"
_FIELDS = {
    "transient_failures",
    "transient_rate",
    "permanent",
    "crash",
    "sleep_s",
    "effect",
    "note",
    "fail_unless_blob",
    "exit_worker",
}
EXIT_WORKER_CODE = 70
"""The exit status of a worker process that `exit_worker` ends."""


def unit_draw(*parts: object) -> float:
    """A deterministic number in [0, 1) from the given parts (same job and attempt, same draw)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class FaultHandler:
    """`fault`: fails on purpose as the payload says, then completes.

    transient_failures: n -> DownstreamUnavailable while attempt < n
    transient_rate: p   -> DownstreamUnavailable with probability p per attempt (deterministic)
    permanent: true     -> InputDataError
    crash: true         -> RuntimeError (unexpected: the host's retry path)
    exit_worker: true   -> os._exit: the worker process dies on every run (the takeover limit)
    sleep_s: s          -> sleeps before finishing
    effect: true        -> applies an idempotent effect keyed by the job id (see apply_effect)
    fail_unless_blob: n -> InputDataError until blob n exists in the results container ("the fix")
    """

    def validate(self, payload: Mapping[str, Any]) -> None:
        problems = [f"payload.{key}: unknown field" for key in sorted(set(payload) - _FIELDS)]
        for key in ("transient_failures",):
            if key in payload and not isinstance(payload[key], int):
                problems.append(f"payload.{key}: must be an integer")
        for key in ("transient_rate", "sleep_s"):
            if key in payload and not isinstance(payload[key], int | float):
                problems.append(f"payload.{key}: must be a number")
        if problems:
            raise PayloadError(problems)

    def run(self, ctx: JobContext) -> Outcome:
        payload = ctx.payload
        if payload.get("exit_worker"):
            ctx.log.warning("fault: exit_worker: ending the worker process now")
            os._exit(EXIT_WORKER_CODE)
        if payload.get("permanent"):
            raise InputDataError("fault: permanent failure requested by the payload")
        marker = payload.get("fail_unless_blob")
        if marker and not ctx.storage.blobs(ctx.settings.results_container).exists(str(marker)):
            raise InputDataError(f"fault: blob {marker} does not exist yet")
        if payload.get("crash"):
            raise RuntimeError("fault: unexpected crash requested by the payload")
        if ctx.attempt < int(payload.get("transient_failures", 0)):
            raise DownstreamUnavailable(
                f"fault: transient failure {ctx.attempt + 1} requested by the payload"
            )
        if unit_draw(ctx.job_id, ctx.attempt) < float(payload.get("transient_rate", 0.0)):
            raise DownstreamUnavailable("fault: transient failure drawn at transient_rate")
        if payload.get("sleep_s"):
            time.sleep(float(payload["sleep_s"]))
        if payload.get("effect"):
            apply_effect(ctx)
        return Completed(result_ref="", summary={"attempt": ctx.attempt})


def apply_effect(ctx: JobContext) -> None:
    """The side effect chaos tests count: created once per job id, never overwritten.

    Every execution that reaches this point is recorded under runs/<id>/; an execution that finds
    the effect already there (a re-run after a crash between effect and ledger completion) is
    recorded under repeats/<id>/. `effects/<id>.json` holds the first execution's facts.
    """
    results = ctx.storage.blobs(ctx.settings.results_container)
    run = uuid.uuid4().hex
    doc = json.dumps({"id": ctx.job_id, "attempt": ctx.attempt, "run": run, "at": time.time()})
    results.write(f"runs/{ctx.job_id}/{run}.json", doc, overwrite=False)
    try:
        results.write(f"{EFFECTS_PREFIX}{ctx.job_id}.json", doc, overwrite=False)
    except AlreadyExists:
        results.write(f"repeats/{ctx.job_id}/{run}.json", doc, overwrite=False)


HANDLERS = {"fault": FaultHandler()}
