"""Producing jobs: validate, claim-check large payloads, enqueue, record `queued`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from azure.core.exceptions import AzureError

from shared import ledger
from shared.documents import Conflict
from shared.envelope import Envelope, claim_check_name, encode_json, fits_queue, parse_dict
from shared.errors import EnvelopeError, MessageTooLarge, PayloadError, StorageThrottled
from shared.ledger import Facts, Record
from shared.messages import NEVER_EXPIRE
from shared.runtime import Runtime
from shared.storage import is_throttled


@dataclass(frozen=True)
class Submitted:
    """The outcome of a submission."""

    envelope: Envelope
    created: bool
    """False when a job with this id already existed (nothing was enqueued)."""
    existing: Record | None = None
    claim_checked: bool = False


def validate_request(rt: Runtime, data: object) -> Envelope:
    """Envelope + payload validation; EnvelopeError lists every problem (payload ones included)."""
    env = parse_dict(data, rt.handlers.keys(), require_id=False)
    if env.payload is not None:
        try:
            rt.handlers[env.kind].validate(env.payload)
        except PayloadError as exc:
            raise EnvelopeError(exc.problems, job_id=env.id) from None
    return env


def submit(rt: Runtime, env: Envelope) -> Submitted:
    """Enqueue a new job (claim check when needed) and record it as queued.

    Enqueue first, then create the record: a crash in between leaves a message the worker
    will process (it creates the record itself), never a record with no message.
    """
    existing = rt.ledger.get(env.id)
    if existing is not None:
        return Submitted(env, created=False, existing=existing)
    checked = False
    if not fits_queue(env):
        env = _claim_check(rt, env)
        checked = True
    send_job(rt, env)
    facts = Facts(rt.clock())
    with contextlib.suppress(Conflict):  # the worker was quicker: its record stands
        rt.ledger.write(env.id, None, lambda prev: ledger.queued(env, facts))
    return Submitted(env, created=True, claim_checked=checked)


def send_job(rt: Runtime, env: Envelope, delay_s: int = 0) -> None:
    """Put a job message on the jobs queue (never expiring), visible after `delay_s`."""
    try:
        rt.jobs_queue.send_message(
            encode_json(env), visibility_timeout=delay_s or None, time_to_live=NEVER_EXPIRE
        )
    except AzureError as exc:
        if is_throttled(exc):
            raise StorageThrottled(
                f"could not enqueue a message of job {env.id}: {exc.__class__.__name__}"
            ) from exc
        raise


def _claim_check(rt: Runtime, env: Envelope) -> Envelope:
    raw = json.dumps(env.payload or {}, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(raw) > rt.settings.max_payload_bytes:
        raise MessageTooLarge(
            f"payload is {len(raw)} bytes; the limit even with claim check is {rt.settings.max_payload_bytes} "
            "(MAX_PAYLOAD_BYTES)"
        )
    name = claim_check_name(env, raw)
    container = rt.storage.container(rt.settings.payloads_container)
    container.upload_blob(name, raw, overwrite=True)
    return replace(env, payload=None, payload_ref=name)


def envelope_from_args(kind: str, payload: Mapping[str, Any], job_id: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"kind": kind, "payload": dict(payload)}
    if job_id:
        data["id"] = job_id
    return data
