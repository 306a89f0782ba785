"""Pure mappings from each backend's state vocabulary to a RunStatus."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.spark.model import RunState, RunStatus

STANDALONE: Mapping[str, RunState] = {
    "SUBMITTED": "pending",
    "RELAUNCHING": "pending",
    "UNKNOWN": "pending",  # master recovering: the driver may still exist
    "RUNNING": "running",
    "FINISHED": "succeeded",
    "FAILED": "failed",
    "ERROR": "failed",
    "KILLED": "failed",
}

LIVY: Mapping[str, RunState] = {
    "not_started": "pending",
    "starting": "pending",
    "recovering": "pending",
    "running": "running",
    "busy": "running",
    "idle": "running",
    "shutting_down": "running",
    "success": "succeeded",
    "dead": "failed",
    "killed": "failed",
    "error": "failed",
}

DATABRICKS_LIFE_CYCLE: Mapping[str, RunState] = {
    "QUEUED": "pending",
    "PENDING": "pending",
    "BLOCKED": "pending",
    "WAITING_FOR_RETRY": "pending",
    "RUNNING": "running",
    "TERMINATING": "running",
    "TERMINATED": "failed",  # refined by result_state
    "SKIPPED": "failed",
    "INTERNAL_ERROR": "failed",
}


def standalone_status(body: Mapping[str, Any]) -> RunStatus:
    """`GET /v1/submissions/status/<id>`: `success: false` means the master does not know the id."""
    raw = str(body.get("driverState") or "")
    message = str(body.get("message") or "")
    if body.get("success") is not True or not raw:
        return RunStatus("unknown", message or "the master does not know this submission", raw)
    state = STANDALONE.get(raw.upper(), "pending")
    return RunStatus(state, message if state == "failed" else raw, raw)


def livy_status(body: Mapping[str, Any]) -> RunStatus:
    """`GET /batches/<id>` or `/batches/<id>/state`. Synapse adds `result` (Succeeded/Failed/...)."""
    raw = str(body.get("state") or "").lower()
    result = str(body.get("result") or "").lower()
    state = LIVY.get(raw, "pending")
    if state == "running" and result in ("failed", "cancelled"):
        state = "failed"
    if state == "succeeded" and result in ("failed", "cancelled"):
        state = "failed"
    message = (
        raw if state != "failed" else f"Livy batch ended in state {raw}" + (f" ({result})" if result else "")
    )
    return RunStatus(state, message, raw)


def databricks_status(body: Mapping[str, Any]) -> RunStatus:
    """`GET /api/2.2/jobs/runs/get`: life_cycle_state, then result_state once terminated."""
    st = body.get("state") or {}
    status = body.get("status") or {}
    life = str(st.get("life_cycle_state") or "").upper()
    result = str(st.get("result_state") or "").upper()
    message = str(st.get("state_message") or "")
    if not life and status:  # 2.2 also reports status{state, termination_details}
        life = str(status.get("state") or "").upper()
        details = status.get("termination_details") or {}
        result = "SUCCESS" if str(details.get("code") or "").upper() == "SUCCESS" else result
        message = message or str(details.get("message") or "")
    state = DATABRICKS_LIFE_CYCLE.get(life, "pending")
    if life == "TERMINATED" and result == "SUCCESS":
        state = "succeeded"
    raw = f"{life}/{result}" if result else life
    if state == "failed":
        message = f"Databricks run {raw}" + (f": {message}" if message else "")
    return RunStatus(state, message or raw, raw)


FABRIC: Mapping[str, RunState] = {
    **LIVY,
    "submitting": "pending",
    "not_submitted": "pending",  # queued before Spark has it; a failed one says so in `result`
}
_FABRIC_FAILED_RESULTS = ("failed", "cancelled", "canceled")


def fabric_status(body: Mapping[str, Any]) -> RunStatus:
    """`GET .../livyApi/versions/<v>/batches/<id>`: Livy's `state`, refined by Fabric's `result`
    (Succeeded, Failed, Cancelled, Uncertain) and `livyInfo.livyState` when `state` is absent."""
    info = body.get("livyInfo")
    nested = info.get("livyState") if isinstance(info, Mapping) else None
    raw = str(body.get("state") or nested or "").lower()
    result = str(body.get("result") or (info.get("result") if isinstance(info, Mapping) else "") or "")
    state = FABRIC.get(raw, "pending")
    if result.lower() in _FABRIC_FAILED_RESULTS:
        state = "failed"
    if state != "failed":
        return RunStatus(state, raw, raw)
    return RunStatus(
        state, f"Fabric batch ended in state {raw or '?'}" + (f" ({result})" if result else ""), raw
    )
