"""The job ledger: one JSON blob per job id, changed only by conditional writes.

create  -> If-None-Match: *   (fails if the record exists)
replace -> If-Match: <etag>   (fails if someone changed it since we read it)

`decide` is the pure state machine that says what a delivery of a job may do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import ContainerClient, ContentSettings

from shared.envelope import isoformat
from shared.errors import StorageThrottled
from shared.storage import error_code, is_throttled

QUEUED = "queued"
IN_PROGRESS = "in_progress"
COMPLETED = "completed"
FAILED = "failed"
RETRY_SCHEDULED = "retry_scheduled"
OFFLOADED = "offloaded"
POISONED = "poisoned"
STATUSES = (QUEUED, IN_PROGRESS, COMPLETED, FAILED, RETRY_SCHEDULED, OFFLOADED, POISONED)
HISTORY_LIMIT = 50
_JSON = ContentSettings(content_type="application/json")


class RecordExists(Exception):
    """create() found a record already there."""


class RecordChanged(Exception):
    """replace() lost a race: the record changed (or vanished) since it was read."""


@dataclass(frozen=True)
class Record:
    """A ledger record as read or written, with the etag that guards the next change."""

    data: dict[str, Any]
    etag: str

    @property
    def status(self) -> str:
        return str(self.data.get("status", ""))


class Decision(Enum):
    """What a delivery of a job may do, given the ledger record."""

    RUN = "run"  # no record, or queued / failed / retry due / expired claim: take it
    RESUME = "resume"  # continue offloaded work with the saved state
    DUPLICATE = "duplicate"  # completed: acknowledge without running
    ALREADY_POISONED = "already_poisoned"  # poisoned: acknowledge (replay resets the ledger)
    STALE = "stale"  # an older message of a job that has moved on: acknowledge
    BUSY = "busy"  # a live claim by another invocation: raise, the message comes back later


def decide(data: dict[str, Any] | None, msg_attempt: int, msg_seq: int | None, now: datetime) -> Decision:
    """The ledger's state machine for one delivery (pure)."""
    if data is None:
        return Decision.RUN
    status = data.get("status")
    if status == COMPLETED:
        return Decision.DUPLICATE
    if status == POISONED:
        return Decision.ALREADY_POISONED
    live_claim = claim_is_live(data, now)
    continuation = data.get("continuation")
    if isinstance(continuation, dict):
        if msg_seq != continuation.get("seq"):
            return Decision.STALE
        return Decision.BUSY if live_claim else Decision.RESUME
    if msg_attempt < int(data.get("attempt", 0)):
        return Decision.STALE
    return Decision.BUSY if live_claim else Decision.RUN


def claim_is_live(data: dict[str, Any], now: datetime) -> bool:
    """True when the record is in progress under a lease that has not expired."""
    if data.get("status") != IN_PROGRESS:
        return False
    raw = data.get("lease_until")
    if not isinstance(raw, str):
        return False
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")) > now
    except ValueError:
        return False


def add_history(data: dict[str, Any], event: str, now: datetime, **details: Any) -> None:
    """Append one event to the record's bounded history."""
    entry = {"at": isoformat(now), "event": event}
    entry.update({k: v for k, v in details.items() if v is not None})
    history = list(data.get("history") or [])
    history.append(entry)
    data["history"] = history[-HISTORY_LIMIT:]


class Ledger:
    """Reads and conditionally writes records in the ledger container."""

    def __init__(self, container: ContainerClient) -> None:
        self.container = container

    def blob_name(self, job_id: str) -> str:
        return f"{job_id}.json"

    def get(self, job_id: str) -> Record | None:
        """One GET; None when the job has no record."""
        blob = self.container.get_blob_client(self.blob_name(job_id))
        try:
            downloader = blob.download_blob()
            raw = downloader.readall()
        except ResourceNotFoundError:
            return None
        except HttpResponseError as exc:
            raise _storage_error(exc, "read", job_id) from exc
        return Record(json.loads(raw), str(downloader.properties.etag))

    def create(self, job_id: str, data: dict[str, Any]) -> Record:
        """One PUT with If-None-Match: *; RecordExists when a record is there."""
        blob = self.container.get_blob_client(self.blob_name(job_id))
        try:
            props = blob.upload_blob(
                _dump(data), match_condition=MatchConditions.IfMissing, content_settings=_JSON
            )
        except ResourceExistsError:
            raise RecordExists(job_id) from None
        except ResourceModifiedError:
            raise RecordExists(job_id) from None
        except HttpResponseError as exc:
            if error_code(exc) in ("BlobAlreadyExists", "ConditionNotMet"):
                raise RecordExists(job_id) from None
            raise _storage_error(exc, "create", job_id) from exc
        return Record(data, str(props["etag"]))

    def replace(self, job_id: str, record: Record, data: dict[str, Any]) -> Record:
        """One PUT with If-Match: etag; RecordChanged when we lost the race."""
        blob = self.container.get_blob_client(self.blob_name(job_id))
        try:
            props = blob.upload_blob(
                _dump(data),
                overwrite=True,
                etag=record.etag,
                match_condition=MatchConditions.IfNotModified,
                content_settings=_JSON,
            )
        except (ResourceModifiedError, ResourceNotFoundError):
            raise RecordChanged(job_id) from None
        except HttpResponseError as exc:
            if error_code(exc) in ("ConditionNotMet", "BlobNotFound"):
                raise RecordChanged(job_id) from None
            raise _storage_error(exc, "update", job_id) from exc
        return Record(data, str(props["etag"]))

    def put(self, job_id: str, data: dict[str, Any], current: Record | None) -> Record:
        """Create when `current` is None, else replace it (both conditional)."""
        return self.create(job_id, data) if current is None else self.replace(job_id, current, data)


def _dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _storage_error(exc: HttpResponseError, action: str, job_id: str) -> Exception:
    if is_throttled(exc):
        return StorageThrottled(f"ledger {action} of job {job_id} failed: storage busy ({exc.status_code})")
    return exc
