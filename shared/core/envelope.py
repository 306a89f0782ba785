"""The job message: strict parsing, encoding for the queue, and claim check for large payloads."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from shared.core import jsontext
from shared.core.errors import EnvelopeError
from shared.core.tracecontext import traceparent_problem, tracestate_problem

ID_RE = re.compile(r"^(?!\.+$)[A-Za-z0-9._:-]{1,128}$")
"""A job id: 1 to 128 letters, digits, '.', '_', ':', '-', and not only dots (a blob name would
normalise `.` and `..` away, so such a job's ledger record and archive entries would be lost)."""
ID_RULE = "must be 1 to 128 characters of letters, digits, '.', '_', ':', '-', and not only dots"
KIND_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
QUEUE_MESSAGE_LIMIT = 65536
"""Characters a queue message may hold (base64 text included)."""

_FIELDS = frozenset(
    {
        "id",
        "kind",
        "payload",
        "payload_ref",
        "attempt",
        "created_at",
        "expires_at",
        "continuation_seq",
        "traceparent",
        "tracestate",
        "recorded",
    }
)
APP_FIELDS = ("attempt", "continuation_seq", "recorded")
"""Fields only the app sets, on the messages it sends itself (retries, continuations, re-checks,
replays). A producer (the API, the CLI's `enqueue`) that gives one is refused."""


@dataclass(frozen=True)
class Envelope:
    """A parsed, validated job message."""

    id: str
    kind: str
    created_at: datetime
    payload: Mapping[str, Any] | None = None
    payload_ref: str | None = None
    attempt: int = 0
    expires_at: datetime | None = None
    continuation_seq: int | None = None
    traceparent: str | None = None
    """W3C trace context of the job (the producer's, or the submission's span): every message of
    the job (retries, continuations, re-checks, recovery re-sends) carries it; a replay gets a new one."""
    tracestate: str | None = None
    recorded: bool = False
    """The job's ledger record was made before this message was sent (the API's submissions,
    and every message the app sends itself): its claim reads the record first instead of trying
    to create it (2 storage requests instead of 3)."""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "kind": self.kind}
        if self.payload_ref is not None:
            data["payload_ref"] = self.payload_ref
        else:
            data["payload"] = dict(self.payload or {})
        data["attempt"] = self.attempt
        data["created_at"] = isoformat(self.created_at)
        if self.expires_at is not None:
            data["expires_at"] = isoformat(self.expires_at)
        if self.continuation_seq is not None:
            data["continuation_seq"] = self.continuation_seq
        if self.traceparent is not None:
            data["traceparent"] = self.traceparent
            if self.tracestate:
                data["tracestate"] = self.tracestate
        if self.recorded:
            data["recorded"] = True
        return data

    def with_attempt(self, attempt: int, continuation_seq: int | None = None) -> Envelope:
        """The app's own message for this job (a retry, continuation or replay): sent once its
        record exists, so `recorded`."""
        return replace(self, attempt=attempt, continuation_seq=continuation_seq, recorded=True)


def isoformat(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_job_id() -> str:
    return str(uuid.uuid4())


def body_digest(body: bytes) -> str:
    """A short content hash that links a message body to facts recorded about it."""
    return hashlib.sha256(body).hexdigest()[:32]


_BASE64_SPACE = b" \t\r\n"


def decode_message(received: bytes) -> bytes:
    """A queue message's body as the app reads it (host.json `messageEncoding: none`).

    Base64 text is decoded: what the app's own senders write, and every message of the base64
    era (whitespace ignored, as .NET does). Any other body is taken as it came: a producer's raw
    JSON, or something the parser refuses and the poison archive keeps byte for byte. Only
    canonical base64 is decoded (the received text is `b64encode` of the result), and a body
    that is JSON as received (`null`, `1234`) is taken as JSON."""
    compact = received.translate(None, _BASE64_SPACE)
    if not compact:
        return received
    try:
        decoded = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        return received
    if base64.b64encode(decoded) != compact or _is_json(received):
        return received
    return decoded


def _is_json(body: bytes) -> bool:
    try:
        json.loads(body)
    except (ValueError, RecursionError):
        return False
    return True


def parse_body(
    body: bytes, known_kinds: Collection[str] | None = None, *, received_at: datetime | None = None
) -> Envelope:
    """Parse a message body (as `decode_message` gives it) into an Envelope. A body without
    `created_at` is dated `received_at` (the queue message's insertion time: the same on every
    delivery of that message), so its expiry, which bounds the ledger's retention, holds for it too."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EnvelopeError(
            [f"message: body (raw, or base64-decoded) is not UTF-8 text (byte {exc.start} of {len(body)})"]
        ) from None
    try:
        data = jsontext.loads(text)
    except json.JSONDecodeError as exc:
        raise EnvelopeError(
            [
                f"message: body (raw, or base64-decoded) is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
            ]
        ) from None
    return parse_dict(data, known_kinds, received_at=received_at)


def parse_dict(
    data: object,
    known_kinds: Collection[str] | None = None,
    *,
    require_id: bool = True,
    producer: bool = False,
    received_at: datetime | None = None,
) -> Envelope:
    """Validate a decoded JSON value as an envelope; EnvelopeError lists every problem.

    `producer=True` for what a producer submits: the app's own fields (`APP_FIELDS`) are refused
    there. Messages on the queue are parsed without it, since the app's retries, continuations,
    re-checks and replays carry them."""
    if not isinstance(data, dict):
        raise EnvelopeError([f"message: expected a JSON object, got {_type_name(data)}"])
    problems: list[str] = []
    for key in sorted(set(data) - _FIELDS):
        problems.append(f"{_field(key)}: unknown field")
    refused = [key for key in APP_FIELDS if producer and key in data]
    problems.extend(f"{key}: set by the app, not by producers" for key in refused)
    job_id = _parse_id(data, problems, require_id)
    kind = data.get("kind")
    if kind is None:
        problems.append("kind: required")
    elif not isinstance(kind, str) or not KIND_RE.match(kind):
        problems.append(f"kind: must be a lower-case name like 'aggregate', got {_short(kind)}")
    elif known_kinds is not None and kind not in known_kinds:
        problems.append(f"kind: unknown kind {kind!r} (known: {', '.join(sorted(known_kinds))})")
    payload = data.get("payload")
    payload_ref = data.get("payload_ref")
    if payload is not None and payload_ref is not None:
        problems.append("payload, payload_ref: give one, not both")
    elif payload is None and payload_ref is None:
        problems.append("payload: required (or payload_ref for a claim-checked payload)")
    elif payload is not None and not isinstance(payload, dict):
        problems.append(f"payload: must be an object, got {_type_name(payload)}")
    elif payload_ref is not None:
        problems.extend(check_payload_ref(payload_ref))
    attempt = 0 if "attempt" in refused else data.get("attempt", 0)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt <= 1000:
        problems.append(f"attempt: must be an integer from 0 to 1000, got {_short(attempt)}")
        attempt = 0
    seq = None if "continuation_seq" in refused else data.get("continuation_seq")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 1):
        problems.append(f"continuation_seq: must be a positive integer, got {_short(seq)}")
        seq = None
    recorded = False if "recorded" in refused else data.get("recorded", False)
    if not isinstance(recorded, bool):
        problems.append(f"recorded: must be true or false, got {_short(recorded)}")
        recorded = False
    created_at = (
        _parse_time(data, "created_at", problems) if "created_at" in data else received_at or utcnow()
    )
    expires_at = _parse_time(data, "expires_at", problems) if "expires_at" in data else None
    traceparent, tracestate = data.get("traceparent"), data.get("tracestate")
    if traceparent is not None and (problem := traceparent_problem(traceparent)):
        problems.append(f"traceparent: {problem}, got {_short(traceparent)}")
    if tracestate is not None and (problem := tracestate_problem(tracestate)):
        problems.append(f"tracestate: {problem}, got {_short(tracestate)}")
    elif tracestate is not None and traceparent is None:
        problems.append("tracestate: only with a traceparent")
    if problems:
        raise EnvelopeError(
            problems, job_id=job_id if isinstance(job_id, str) and ID_RE.match(job_id) else None
        )
    assert isinstance(kind, str) and created_at is not None
    return Envelope(
        id=job_id or new_job_id(),
        kind=kind,
        created_at=created_at,
        payload=payload,
        payload_ref=payload_ref,
        attempt=attempt,
        expires_at=expires_at,
        continuation_seq=seq,
        traceparent=traceparent,
        tracestate=tracestate,
        recorded=recorded,
    )


def best_effort_id(body: bytes) -> str | None:
    """The job id of a body that may be invalid in other ways, when one can be read."""
    try:
        data = jsontext.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    job_id = data.get("id") if isinstance(data, dict) else None
    return job_id if isinstance(job_id, str) and ID_RE.match(job_id) else None


def check_payload_ref(ref: object) -> list[str]:
    """Problems with a claim-check blob name (no path tricks)."""
    if not isinstance(ref, str):
        return [f"payload_ref: must be a string, got {_type_name(ref)}"]
    problems = []
    if not ref or len(ref) > 1024:
        problems.append("payload_ref: must be 1 to 1024 characters")
    if ref.startswith("/") or "\\" in ref or "//" in ref:
        problems.append(f"payload_ref: {ref!r} must be a relative blob name without '\\' or '//'")
    if any(part in (".", "..") for part in ref.split("/")):
        problems.append(f"payload_ref: {ref!r} must not contain '.' or '..' segments")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in ref):
        problems.append("payload_ref: must not contain control characters")
    return problems


def encode_text(envelope: Envelope) -> str:
    """The message text as the app puts it on the queue (JSON, UTF-8, base64): readable by
    `decode_message`, and by a host still set to `messageEncoding: base64` (a rollback)."""
    raw = json.dumps(envelope.to_dict(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return base64.b64encode(raw).decode("ascii")


def encode_json(envelope: Envelope) -> str:
    """The JSON text of an envelope (what the base64 policy of a queue client then encodes)."""
    return json.dumps(envelope.to_dict(), separators=(",", ":"), ensure_ascii=False)


def fits_queue(envelope: Envelope) -> bool:
    return len(encode_text(envelope)) <= QUEUE_MESSAGE_LIMIT


def claim_check_name(envelope: Envelope, payload_json: bytes) -> str:
    """Blob name of a claim-checked payload: keyed by job id and content."""
    return f"{envelope.id}/{hashlib.sha256(payload_json).hexdigest()[:16]}.json"


def _parse_id(data: Mapping[str, Any], problems: list[str], required: bool) -> str | None:
    if "id" not in data:
        if required:
            problems.append("id: required")
        return None
    job_id = data["id"]
    if not isinstance(job_id, str):
        problems.append(f"id: must be a string, got {_type_name(job_id)}")
        return None
    if not ID_RE.match(job_id):
        problems.append(f"id: {_short(job_id)} {ID_RULE}")
        return None
    return job_id


def _parse_time(data: Mapping[str, Any], key: str, problems: list[str]) -> datetime | None:
    raw = data.get(key)
    if not isinstance(raw, str):
        problems.append(f"{key}: must be an ISO-8601 string, got {_type_name(raw)}")
        return None
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        problems.append(f"{key}: {_short(raw)} is not an ISO-8601 date-time")
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment


def _field(key: object) -> str:
    if isinstance(key, str) and key.isprintable() and len(key) <= 64:
        return key
    return _short(key)


def _type_name(value: object) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
    }.get(type(value), "null" if value is None else type(value).__name__)


def _short(value: object) -> str:
    text = (
        json.dumps(value)
        if isinstance(value, str | int | float | bool) or value is None
        else _type_name(value)
    )
    return text if len(text) <= 80 else text[:77] + "..."
