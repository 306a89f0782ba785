"""Where a Spark run leaves its result and its error report, and how the function reads them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.blob import ContainerClient

from shared.errors import StorageThrottled
from shared.storage import is_throttled


def result_blob(job_id: str) -> str:
    """The result document's name in the results container (same as the inline engine's)."""
    return f"{job_id}.json"


def error_blob(job_id: str, submission: int) -> str:
    """The error report a failing Spark run writes (one per submission)."""
    return f"_spark/{job_id}/error-s{submission}.json"


@dataclass(frozen=True)
class RunError:
    """What the job reported before exiting non-zero."""

    message: str
    kind: str
    """input_data | payload | unexpected: input_data and payload cannot be fixed by a new run."""

    @property
    def permanent(self) -> bool:
        return self.kind in ("input_data", "payload")


def read_result(container: ContainerClient, job_id: str) -> dict[str, Any] | None:
    """The result document if it exists and belongs to `job_id`; None otherwise."""
    doc = _read_json(container, result_blob(job_id))
    if doc is None or doc.get("id") != job_id or not isinstance(doc.get("rows"), list):
        return None
    return doc


def read_error(container: ContainerClient, job_id: str, submission: int) -> RunError | None:
    """The error report of one submission, if the job managed to write one."""
    doc = _read_json(container, error_blob(job_id, submission))
    if doc is None or doc.get("id") != job_id or doc.get("submission") != submission:
        return None
    return RunError(message=str(doc.get("error") or ""), kind=str(doc.get("kind") or "unexpected"))


def _read_json(container: ContainerClient, name: str) -> dict[str, Any] | None:
    try:
        raw = container.get_blob_client(name).download_blob().readall()
    except ResourceNotFoundError:
        return None
    except HttpResponseError as exc:
        if is_throttled(exc):
            raise StorageThrottled(f"storage busy while reading {name}") from None
        raise
    except Exception as exc:
        if is_throttled(exc):
            raise StorageThrottled(f"storage unreachable while reading {name}") from None
        raise
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
