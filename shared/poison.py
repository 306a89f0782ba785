"""Poison handling: the poison-queue handler (never throws on a body), and operator tools.

Archive layout in the poison-archive container:
  jobs/<job id>/<body digest>.json   one entry per distinct poisoned body of a job
  unparsed/<body digest>.json        bodies with no readable job id
  reasons/<body digest>.json         why the app itself poisoned a body (written before the copy)
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import ContainerClient

from shared.envelope import best_effort_id, body_digest, encode_json, isoformat, parse_body, utcnow
from shared.errors import EnvelopeError
from shared.ledger import (
    COMPLETED,
    POISONED,
    QUEUED,
    Record,
    RecordChanged,
    RecordExists,
    add_history,
    claim_is_live,
)
from shared.observability import log_decision
from shared.processing import NEVER_EXPIRE, QueueMessageLike
from shared.runtime import Runtime, get_runtime

log = logging.getLogger("jobs.poison")
HOST_REASON = "the host moved it after maxDequeueCount failed runs"


# -- the poison-queue trigger ---------------------------------------------------------------


def handle_poison_message(msg: QueueMessageLike, rt: Runtime | None = None) -> None:
    """Archive one poisoned message and mark its job poisoned.

    Never raises because of the body. Raises only when storage is unreachable, so that the
    message comes back later instead of being deleted unarchived.
    """
    try:
        body = msg.get_body() or b""
    except Exception:  # a body the worker could not even hand over
        body = b""
    try:
        rt = rt or get_runtime()
        _archive_and_mark(rt, msg, body)
    except AzureError:
        log.exception("poison message %s: storage failed while archiving; it will come back", msg.id)
        raise
    except Exception:
        log.exception("poison message %s: unexpected error while archiving; logged and dropped", msg.id)


def _archive_and_mark(rt: Runtime, msg: QueueMessageLike, body: bytes) -> None:
    digest = body_digest(body)
    job_id = best_effort_id(body)
    archive = rt.storage.container(rt.settings.poison_archive_container)
    app_reason = _read_json(archive, f"reasons/{digest}.json")
    record = rt.ledger.get(job_id) if job_id else None
    now = utcnow()
    if record is not None and record.status == COMPLETED:
        state, reason = "duplicate_of_completed", "a copy of a job that had already completed"
    elif record is not None and claim_is_live(record.data, now):
        state, reason = "duplicate_of_running", "a copy of a job that another invocation is running"
    else:
        state = "poisoned"
        reason = _reason(app_reason, record)
    entry = {
        "job_id": job_id,
        "digest": digest,
        "state": state,
        "reason": reason,
        "queue_message_id": msg.id,
        "dequeue_count": msg.dequeue_count,
        "archived_at": isoformat(now),
        "body_b64": base64.b64encode(body).decode("ascii"),
        "body_bytes": len(body),
        "history": (record.data.get("history") if record else None) or [],
        "attempt": record.data.get("attempt") if record else None,
        "events": [{"at": isoformat(now), "event": state}],
    }
    name = archive_name(job_id, digest)
    _write_archive(archive, name, entry)
    if state == "poisoned" and job_id is not None:
        _set_poisoned(rt, job_id, record, reason, body, now)
    log_decision(
        "archived",
        job_id,
        queue_message_id=msg.id,
        dequeue_count=msg.dequeue_count,
        reason=reason,
        state=state,
        archive=name,
        level=logging.WARNING,
    )


def archive_name(job_id: str | None, digest: str) -> str:
    return f"jobs/{job_id}/{digest}.json" if job_id else f"unparsed/{digest}.json"


def _reason(app_reason: dict[str, Any] | None, record: Record | None) -> str:
    if app_reason and app_reason.get("reason"):
        return str(app_reason["reason"])
    if record is not None and record.status == POISONED and record.data.get("reason"):
        return str(record.data["reason"])
    if record is not None and record.data.get("error"):
        return f"{HOST_REASON}; last error: {record.data['error']}"
    return HOST_REASON


def _write_archive(archive: ContainerClient, name: str, entry: dict[str, Any]) -> None:
    """Create the entry; when it exists (same body poisoned again), re-open it."""
    blob = archive.get_blob_client(name)
    try:
        blob.upload_blob(json.dumps(entry), match_condition=MatchConditions.IfMissing)
        return
    except (ResourceExistsError, ResourceModifiedError):
        pass
    for _ in range(3):
        downloader = blob.download_blob()
        old = json.loads(downloader.readall())
        merged = {**entry, "events": (old.get("events") or []) + entry["events"]}
        try:
            blob.upload_blob(
                json.dumps(merged),
                overwrite=True,
                etag=downloader.properties.etag,
                match_condition=MatchConditions.IfNotModified,
            )
            return
        except ResourceModifiedError:
            continue


def _set_poisoned(
    rt: Runtime, job_id: str, record: Record | None, reason: str, body: bytes, now: datetime
) -> None:
    if record is not None and record.status == POISONED:
        return
    data = dict(record.data) if record else {"id": job_id, "created_at": isoformat(now)}
    data.update(
        status=POISONED,
        reason=reason,
        poisoned_at=isoformat(now),
        updated_at=isoformat(now),
        body=body[:16_000].decode("utf-8", errors="replace"),
    )
    data.pop("lease_until", None)
    add_history(data, "poisoned", now, reason=reason)
    try:
        rt.ledger.put(job_id, data, record)
    except (RecordChanged, RecordExists):
        log.warning("job %s: ledger changed while marking it poisoned; left as is", job_id)


def _read_json(container: ContainerClient, name: str) -> dict[str, Any] | None:
    try:
        data = json.loads(container.get_blob_client(name).download_blob().readall())
    except ResourceNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


# -- the sweeper: bodies the host cannot hand to handle_poison ------------------------------

UNREADABLE_REASON = (
    "body is not valid base64, so the host cannot hand it to any function (messageEncoding: base64)"
)


def sweep_unreadable(rt: Runtime | None = None, limit: int = 32) -> int:
    """Archive and remove poison-queue messages that are not base64.

    The host cannot decode them, and a poison queue has no poison queue of its own, so they
    would come back forever. Peeks first: nothing is received unless something is unreadable.
    Returns how many were archived.
    """
    rt = rt or get_runtime()
    queue = rt.poison_queue
    if all(_is_base64(str(m.content or "")) for m in queue.peek_messages(max_messages=min(32, limit))):
        return 0
    archive = rt.storage.container(rt.settings.poison_archive_container)
    swept = 0
    for msg in queue.receive_messages(max_messages=min(32, limit), visibility_timeout=60):
        text = str(msg.content or "")
        if _is_base64(text):
            queue.update_message(msg, visibility_timeout=0)  # readable: leave it to handle_poison
            continue
        body = text.encode("utf-8", errors="surrogateescape")
        digest = body_digest(body)
        now = isoformat(utcnow())
        entry = {
            "job_id": None,
            "digest": digest,
            "state": "poisoned",
            "reason": UNREADABLE_REASON,
            "queue_message_id": msg.id,
            "dequeue_count": msg.dequeue_count,
            "archived_at": now,
            "body_b64": base64.b64encode(body).decode("ascii"),
            "body_bytes": len(body),
            "history": [],
            "attempt": None,
            "events": [{"at": now, "event": "swept"}],
        }
        _write_archive(archive, archive_name(None, digest), entry)
        queue.delete_message(msg)
        swept += 1
        log_decision(
            "archived",
            None,
            queue_message_id=msg.id,
            dequeue_count=msg.dequeue_count,
            reason=UNREADABLE_REASON,
            state="poisoned",
            level=logging.WARNING,
        )
    return swept


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        return False
    return True


# -- operator tools ---------------------------------------------------------------------------


@dataclass
class PoisonEntry:
    """One archived poison message, as operators see it."""

    name: str
    job_id: str | None
    state: str
    reason: str
    archived_at: str
    attempts: int
    body_bytes: int
    age_s: float = 0.0


@dataclass
class ReplayReport:
    """What a replay did (or would do, in a dry run)."""

    replayed: list[str] = field(default_factory=list)
    skipped_completed: list[str] = field(default_factory=list)
    skipped_invalid: list[str] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "replayed": self.replayed,
            "skipped_completed": self.skipped_completed,
            "skipped_invalid": self.skipped_invalid,
            "not_found": self.not_found,
        }


def list_poisoned(rt: Runtime, include_done: bool = False) -> list[PoisonEntry]:
    """Archived poison entries (oldest first). Reads blobs only: no message is taken."""
    archive = rt.storage.container(rt.settings.poison_archive_container)
    now = datetime.now(UTC)
    entries = []
    for name in _archive_names(archive):
        data = _read_json(archive, name)
        if data is None or (not include_done and data.get("state") != "poisoned"):
            continue
        archived = str(data.get("archived_at", ""))
        entries.append(
            PoisonEntry(
                name=name,
                job_id=data.get("job_id"),
                state=str(data.get("state")),
                reason=str(data.get("reason", "")),
                archived_at=archived,
                attempts=sum(1 for e in data.get("history") or [] if e.get("event") == "claimed"),
                body_bytes=int(data.get("body_bytes", 0)),
                age_s=_age_s(archived, now),
            )
        )
    return sorted(entries, key=lambda e: e.archived_at)


def peek_poison_queue(rt: Runtime, limit: int = 32) -> list[dict[str, Any]]:
    """Messages still on <queue>-poison (not yet archived), without taking them."""
    out = []
    for msg in rt.poison_queue.peek_messages(max_messages=min(32, limit)):
        text = str(msg.content or "")
        try:
            job_id = best_effort_id(base64.b64decode(text, validate=True))
        except ValueError:
            job_id = None
        out.append(
            {
                "queue_message_id": msg.id,
                "job_id": job_id,
                "inserted_on": str(msg.inserted_on),
                "dequeue_count": msg.dequeue_count,
                "chars": len(text),
            }
        )
    return out


def replay(
    rt: Runtime,
    job_ids: Iterable[str] | None,
    *,
    rate_per_s: float = 10.0,
    dry_run: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
) -> ReplayReport:
    """Send poisoned jobs back to the main queue, at most `rate_per_s` a second.

    Per job: skip if completed; reset the ledger to queued (attempt 0); enqueue; mark the
    archive entry replayed. Interrupted anywhere, a second run finishes the work: entries not
    yet marked are replayed again, and the ledger keeps a job from being applied twice.
    """
    archive = rt.storage.container(rt.settings.poison_archive_container)
    by_job: dict[str, list[str]] = {}
    for entry in list_poisoned(rt):
        if entry.job_id:
            by_job.setdefault(entry.job_id, []).append(entry.name)
    wanted = list(by_job) if job_ids is None else list(dict.fromkeys(job_ids))
    report = ReplayReport(dry_run=dry_run)
    interval = 1.0 / rate_per_s if rate_per_s > 0 else 0.0
    next_at = time.monotonic()
    for index, job_id in enumerate(wanted, start=1):
        names = by_job.get(job_id)
        if not names:
            report.not_found.append(job_id)
        else:
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            next_at = max(next_at, time.monotonic()) + interval
            outcome = _replay_one(rt, archive, job_id, names, dry_run)
            getattr(report, outcome).append(job_id)
        if progress:
            progress(index, len(wanted), job_id)
    return report


def _replay_one(rt: Runtime, archive: ContainerClient, job_id: str, names: list[str], dry_run: bool) -> str:
    latest = max((_read_json(archive, n) or {} for n in names), key=lambda d: str(d.get("archived_at", "")))
    body = base64.b64decode(latest.get("body_b64", ""))
    record = rt.ledger.get(job_id)
    if record is not None and record.status == COMPLETED:
        if not dry_run:
            _mark_entries(archive, names, "skipped_completed")
        return "skipped_completed"
    try:
        env = parse_body(body, rt.handlers.keys())
    except EnvelopeError:
        return "skipped_invalid"
    if dry_run:
        return "replayed"
    now = utcnow()
    data: dict[str, Any] = (
        dict(record.data)
        if record
        else {"id": job_id, "kind": env.kind, "created_at": isoformat(env.created_at)}
    )
    last_reason = data.get("reason")
    for key in (
        "reason",
        "reason_code",
        "lease_until",
        "continuation",
        "owner",
        "error",
        "next_run_at",
        "body",
    ):
        data.pop(key, None)
    data.update(
        status=QUEUED,
        attempt=0,
        updated_at=isoformat(now),
        replayed_at=isoformat(now),
        replay_count=int(data.get("replay_count", 0)) + 1,
        last_reason=last_reason,
    )
    add_history(data, "replayed", now)
    try:
        rt.ledger.put(job_id, data, record)
    except (RecordChanged, RecordExists):
        return "skipped_completed" if (r := rt.ledger.get(job_id)) and r.status == COMPLETED else "not_found"
    rt.jobs_queue.send_message(encode_json(env.with_attempt(0)), time_to_live=NEVER_EXPIRE)
    _mark_entries(archive, names, "replayed")
    log_decision("replayed", job_id, attempt=0, replay_count=data["replay_count"])
    return "replayed"


def _mark_entries(archive: ContainerClient, names: list[str], state: str) -> None:
    for name in names:
        blob = archive.get_blob_client(name)
        downloader = blob.download_blob()
        data = json.loads(downloader.readall())
        data["state"] = state
        data.setdefault("events", []).append({"at": isoformat(utcnow()), "event": state})
        try:
            blob.upload_blob(
                json.dumps(data),
                overwrite=True,
                etag=downloader.properties.etag,
                match_condition=MatchConditions.IfNotModified,
            )
        except ResourceModifiedError:
            log.warning("archive entry %s changed while marking it %s", name, state)


def purge(rt: Runtime, older_than_days: float, dry_run: bool = False) -> list[str]:
    """Delete archive entries (and recorded reasons) older than N days. Returns their names."""
    archive = rt.storage.container(rt.settings.poison_archive_container)
    cutoff = datetime.now(UTC) - timedelta(days=older_than_days)
    doomed = [b.name for b in archive.list_blobs() if b.last_modified and b.last_modified < cutoff]
    if not dry_run:
        for name in doomed:
            with contextlib.suppress(ResourceNotFoundError):
                archive.delete_blob(name)
    return doomed


def _archive_names(archive: ContainerClient) -> Iterator[str]:
    for prefix in ("jobs/", "unparsed/"):
        for blob in archive.list_blobs(name_starts_with=prefix):
            yield blob.name


def _age_s(stamp: str, now: datetime) -> float:
    try:
        return (now - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds()
    except ValueError:
        return 0.0
