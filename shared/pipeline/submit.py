"""Producing jobs: validate, record `queued`, claim-check large payloads, enqueue.

The ledger's conditional create decides which request owns a job id: the `queued` record is
created first (If-None-Match), carrying `send_pending`, the request's digest and a send lease;
then the payload is uploaded (claim check only) and the message sent; then the marker is cleared
(`sent`, If-Match). Happy path: 5 storage requests (create, send, clear, and the jobs index's
entry after the create and the clear), 6 with a claim check.

The API hands its message to the Functions host instead (`out`: the function's queue output
binding). The host sends it once the function returns, before the HTTP answer, and wakes its own
listener on the jobs queue at once; a message this app sends itself waits for the listener's next
poll, up to `maxPollingInterval`. No write can follow the host's send, so the marker stays until
the first delivery's claim drops it, and the record keeps the envelope: the host's message lives
the queue's default 7 days, so recovery sends it again, never expiring, if no delivery has
claimed the job after `RESEND_AFTER_S` (shared/ledger/send.py). Happy path: 3 requests (create,
its index entry, the host's send). A failed host send fails the function: the caller gets 500
and the lease rules below apply (the same request, retried after the lease, sends it). A failed
upload (claim check) answers 503 and keeps nothing to send later: the same request, retried,
keeps it again.

Bounded in time: the API makes these calls inside `bounded_calls(SUBMIT_CALLS)` (one retry, short
timeouts), so a storage failure before the send answers 503 with Retry-After within seconds, not
after the SDK's retries. Once the message is sent the job is accepted: the clear is tried once
(`CLEAR_CALLS`, no retry) and, if it fails, the marker stays and the request still answers 202.

- Two requests for one id at once: one creates; the other reads the record and waits while the
  creator holds the send lease, then answers 409 (the marker cleared, or a delivery took the job).
- The send fails: the creator ends its lease (`send_failed`) and answers 503; the same request
  retried (same id, kind, payload, expires_at) takes the send over (`send_resumed`) and answers 202.
- The creator dies between create and clear: its lease runs out (`SEND_LEASE_S`) and the same
  request retried takes the send over. The message may then be on the queue twice; the ledger
  runs the job once.
- The clear fails after the send (202): as if the creator had died after sending. The first
  delivery drops the marker (`claimed`); until then the same request, posted again, waits out the
  lease, sends again and answers 202 again; the second message meets the ledger, which runs the
  job once. A different request with the id still gets 409.
- A retry that finds the job taken by a delivery (in progress, completed, ...), or a different
  request with the same id, answers 409 with the status and sends nothing.
- Host-sent (the API): the same request posted again before the first delivery's claim finds
  the marker, as after a failed clear: it waits out the lease, sends again, answers 202.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from shared import ledger
from shared.core.documents import Conflict
from shared.core.envelope import (
    Envelope,
    body_digest,
    claim_check_name,
    encode_json,
    fits_queue,
    isoformat,
    parse_dict,
)
from shared.core.errors import EnvelopeError, MessageTooLarge, PayloadError
from shared.ledger import Facts, Record
from shared.ledger import send as ledger_send
from shared.ledger.view import RecordView
from shared.runtime.sending import send_job
from shared.runtime.wiring import Runtime
from shared.storage.clients import CallBudget, bounded_calls

log = logging.getLogger("jobs.submit")
SEND_LEASE_S = 30.0
"""Seconds the request that created a job's record has to send its message (plus
`SEND_LEASE_S_PER_MIB` per MiB of claim-checked payload to upload) before the same request,
retried, may send it instead."""
SEND_LEASE_S_PER_MIB = 1.0
WAIT_FIRST_S = 0.05
"""First pause of a request waiting on another request's pending send (doubling, up to `WAIT_MAX_S`)."""
WAIT_MAX_S = 2.0
MAX_WAIT_S = 60.0
"""Longest a request waits on another's pending send before answering 503 with Retry-After."""
MAX_ROUNDS = 200
SUBMIT_CALLS = CallBudget(retries=1, backoff_s=0.5, connect_s=2.0, read_s=3.0)
"""Each storage call of a POST /api/jobs: one retry after 0.5 s, 2 s to connect, 3 s to answer.
A storage answering 503 costs a call about 0.5 s, one that does not answer about 6.5 s (the
clients' own retries: about 10 s, and 30 s per try)."""
CLEAR_CALLS = CallBudget(retries=0, backoff_s=0.0, connect_s=2.0, read_s=3.0)
"""The write that clears `send_pending` once the message is sent: one try; the lease covers a failure."""


class MessageOut(Protocol):
    """Where the Functions host takes a message to send when the function returns (`func.Out`)."""

    def set(self, val: str) -> None: ...


@dataclass(frozen=True)
class Submitted:
    """The outcome of a submission."""

    envelope: Envelope
    created: bool
    """True: this request put the job on the queue (202). False: the job was there (409)."""
    existing: Record | None = None
    claim_checked: bool = False
    same_request: bool = False
    """With `created=False`: the existing job came from a request like this one (a retry)."""


class SubmissionBusy(Exception):
    """Another request holds the job's pending send for longer than a request waits (503)."""

    def __init__(self, job_id: str, retry_after_s: float) -> None:
        self.retry_after_s = max(1, int(retry_after_s + 0.999))
        super().__init__(
            f"job {job_id} is being submitted by another request; retry in {self.retry_after_s} s"
        )


def validate_request(rt: Runtime, data: object) -> Envelope:
    """Envelope + payload validation; EnvelopeError lists every problem (payload ones included).
    A producer may not set the app's own fields (`attempt`, `continuation_seq`)."""
    env = parse_dict(data, rt.handlers.keys(), require_id=False, producer=True)
    if env.payload is not None:
        try:
            rt.handlers[env.kind].validate(env.payload)
        except PayloadError as exc:
            raise EnvelopeError(exc.problems, job_id=env.id) from None
    return env


def request_digest(env: Envelope) -> str:
    """What makes two submissions the same request: id, kind, payload (or payload_ref) and
    expires_at; not created_at, which defaults to each request's own time."""
    fields = {
        "id": env.id,
        "kind": env.kind,
        "payload": None if env.payload is None else dict(env.payload),
        "payload_ref": env.payload_ref,
        "expires_at": None if env.expires_at is None else isoformat(env.expires_at),
    }
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return body_digest(text.encode("utf-8"))


def submit(rt: Runtime, env: Envelope, out: MessageOut | None = None) -> Submitted:
    """Create the job's `queued` record, then put its message on the queue, or hand it to `out`
    for the Functions host to send (module docstring)."""
    request = request_digest(env)
    payload: bytes | None = None
    if not fits_queue(env):
        env, payload = _claim_check_plan(rt, env)
    lease_s = SEND_LEASE_S + SEND_LEASE_S_PER_MIB * len(payload or b"") / 2**20
    return _Submission(rt, env, request, payload, lease_s, out).run()


class _Submission:
    """One request's submission of one job."""

    def __init__(
        self,
        rt: Runtime,
        env: Envelope,
        request: str,
        payload: bytes | None,
        lease_s: float,
        out: MessageOut | None,
    ) -> None:
        self.rt = rt
        self.env = env
        self.request = request
        self.payload = payload
        """The claim-checked payload to upload before sending (None: inline)."""
        self.lease_s = lease_s
        self.out = out
        """The host sends the message (None: this request sends it and clears the marker)."""
        self.me = uuid.uuid4().hex
        self.mine: set[str] = set()

    def run(self) -> Submitted:
        rt, job_id = self.rt, self.env.id
        give_up = rt.clock() + timedelta(seconds=MAX_WAIT_S)
        pause = WAIT_FIRST_S
        current: Record | None = None
        for _ in range(MAX_ROUNDS):
            if current is None:
                try:
                    return self.send(rt.ledger.write(job_id, None, self._queued, self.mine))
                except Conflict:
                    pass  # the id exists: what happens depends on its record
            current = rt.ledger.get(job_id)
            if current is None:
                continue  # removed since (an operator): create it afresh
            if RecordView.of(current).request_digest != self.request or not ledger_send.send_is_pending(
                current.data
            ):
                return self.exists(current)
            now = rt.clock()
            end = ledger_send.send_lease_end(current.data)
            if end is None or end <= now:  # its submitter failed or died: take the send over
                self.env = replace(self.env, created_at=_created_at(current, self.env.created_at))
                try:
                    record = rt.ledger.write(job_id, current, self._resumed, self.mine)
                except Conflict:
                    continue
                return self.send(record)
            if now >= give_up:
                raise SubmissionBusy(job_id, (end - now).total_seconds())
            rt.sleep(min(pause, (end - now).total_seconds()))
            pause = min(2 * pause, WAIT_MAX_S)
        raise SubmissionBusy(job_id, WAIT_MAX_S)  # the record kept changing under us

    def send(self, record: Record) -> Submitted:
        """Upload (claim check), send, then clear the marker: the job is accepted. Host-sent:
        upload, then hand the message over; the marker stays for the first claim to drop."""
        rt, env = self.rt, self.env
        try:
            if self.payload is not None:
                _upload_payload(rt, env, self.payload)
            if self.out is not None:
                self.out.set(encode_json(replace(env, recorded=True)))
                return Submitted(env, created=True, claim_checked=self.payload is not None)
            send_job(rt, replace(env, recorded=True))  # its claim reads the record we made
        except Exception as exc:
            self._send_failed(record, exc)
            raise
        with bounded_calls(CLEAR_CALLS):  # one try per call once the message is sent
            try:
                rt.ledger.write(env.id, record, self._sent, set())  # set(): no retry on our own record
            except Conflict:  # a delivery claimed it already (fine), or a retry took over after our lease
                current = self._read_quietly()
                if current is not None and RecordView.of(current).submitter != self.me:
                    return self.exists(current)
            except Exception as exc:
                # The message is on the queue: the job is accepted. The marker stays until the
                # first delivery drops it; meanwhile the same request, posted again, may send it
                # once more after our lease, and the ledger runs the job once (module docstring).
                log.warning(
                    "job %s: sent; send_pending left for its first delivery to clear (%s)",
                    env.id,
                    exc.__class__.__name__,
                )
        return Submitted(env, created=True, claim_checked=self.payload is not None)

    def exists(self, current: Record) -> Submitted:
        same = RecordView.of(current).request_digest == self.request
        return Submitted(self.env, created=False, existing=current, same_request=same)

    def _send_failed(self, record: Record, exc: Exception) -> None:
        """End our send lease at once so the producer's retry can send (best effort)."""
        error = f"{exc.__class__.__name__}: {exc}"[:500]
        facts = Facts(self.rt.clock())
        try:
            self.rt.ledger.write(
                self.env.id,
                record,
                lambda prev: ledger_send.send_failed(prev, self.env.id, facts, self.me, error),
                self.mine,
            )
        except Exception as write_error:  # the lease then ends by itself
            log.warning("job %s: send failed; lease not released (%s)", self.env.id, write_error)

    def _read_quietly(self) -> Record | None:
        try:
            return self.rt.ledger.get(self.env.id)
        except Exception:
            return None

    def _queued(self, prev: ledger.Data | None) -> ledger.Data:
        facts = Facts(self.rt.clock())
        return ledger_send.queued(
            self.env,
            facts,
            request=self.request,
            submitter=self.me,
            send_lease_s=self.lease_s,
            host_sends=self.out is not None,
        )

    def _resumed(self, prev: ledger.Data | None) -> ledger.Data:
        host_sends = self.env if self.out is not None else None
        return ledger_send.send_resumed(
            prev, self.env.id, Facts(self.rt.clock()), self.me, self.lease_s, host_sends
        )

    def _sent(self, prev: ledger.Data | None) -> ledger.Data:
        return ledger_send.sent(prev, self.env.id, Facts(self.rt.clock()), self.me)


def _created_at(record: Record, default: datetime) -> datetime:
    """The job's created_at as first recorded (a retried request's own time is later)."""
    return RecordView.of(record).created_at or default


def _claim_check_plan(rt: Runtime, env: Envelope) -> tuple[Envelope, bytes]:
    """The envelope that refers to the payload blob, and the bytes to upload; no I/O yet."""
    raw = json.dumps(env.payload or {}, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(raw) > rt.settings.max_payload_bytes:
        raise MessageTooLarge(
            f"payload is {len(raw)} bytes; the limit even with claim check is {rt.settings.max_payload_bytes} "
            "(MAX_PAYLOAD_BYTES)"
        )
    return replace(env, payload=None, payload_ref=claim_check_name(env, raw)), raw


def _upload_payload(rt: Runtime, env: Envelope, raw: bytes) -> None:
    """The claim-checked payload; its name is keyed by content, so a retry writes the same bytes."""
    assert env.payload_ref is not None
    rt.account.blobs(rt.settings.payloads_container).write(env.payload_ref, raw)


def envelope_from_args(kind: str, payload: Mapping[str, Any], job_id: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"kind": kind, "payload": dict(payload)}
    if job_id:
        data["id"] = job_id
    return data
