"""Exception classes that decide what happens to a job next.

- PermanentError: retrying cannot help -> poison at once, reason kept.
- TransientError: may succeed later -> re-enqueue with backoff, poison after MAX_ATTEMPTS.
- ClaimLost: another writer changed our job's record -> the delivery is acknowledged with a
  re-check message (see processing), never silently.
- Anything else: unexpected -> raise; the host's visibilityTimeout / maxDequeueCount apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SettingsError(Exception):
    """A setting is missing or invalid. The message names the setting. Fix configuration."""


class JobError(Exception):
    """Base class for errors raised while processing one job."""


class PermanentError(JobError):
    """Retrying cannot help: the job goes to poison now, with this message as its reason."""

    reason_code = "permanent"


class RunAbandoned(PermanentError):
    """Offloaded work is given up; `cancelled_run` (if any) says what was cancelled on the cluster,
    for the ledger."""

    reason_code = "offload_failed"

    def __init__(self, message: str, cancelled_run: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.cancelled_run = dict(cancelled_run) if cancelled_run else None


class CancelledByOperator(PermanentError):
    """An operator asked to cancel the job: it is poisoned at its next delivery (replayable)."""

    reason_code = "cancelled"


class EnvelopeError(PermanentError):
    """The queue message is not a valid job envelope. `problems` lists each field's issue."""

    reason_code = "bad_envelope"

    def __init__(self, problems: list[str], job_id: str | None = None) -> None:
        self.problems = list(problems)
        self.job_id = job_id
        super().__init__("; ".join(self.problems))


class UnknownKind(PermanentError):
    """No handler is registered for the envelope's kind."""

    reason_code = "unknown_kind"


class PayloadError(PermanentError):
    """The payload does not fit the job kind's schema."""

    reason_code = "bad_payload"

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class InputDataError(PermanentError):
    """The input data cannot be processed (e.g. a non-number in a numeric column)."""

    reason_code = "bad_input_data"


class InputMissing(PermanentError):
    """A blob the job refers to (input or claim-check payload) does not exist."""

    reason_code = "input_missing"


class NotAvailable(PermanentError):
    """The job asks for a capability this deployment does not have (e.g. no Spark backend)."""

    reason_code = "not_available"


class InputRefused(PermanentError):
    """The job names an input it may not read: one of the app's or the host's own containers,
    or a container outside `INPUT_CONTAINERS`. Nothing is read from it."""

    reason_code = "input_refused"


class LimitExceeded(PermanentError):
    """The job is over a configured bound on its work (e.g. `MAX_GROUPS`, `MAX_PAYLOAD_BYTES`);
    the message names the setting and what to do."""

    reason_code = "over_limit"


class Expired(PermanentError):
    """The job is past its expires_at: it is not run."""

    reason_code = "expired"


class KindNotAllowed(PermanentError):
    """The job's kind is not one its queue runs (`QUEUE_<NAME>_KINDS`): it is not run."""

    reason_code = "kind_not_allowed"


class RunsDied(PermanentError):
    """The job's runs died `MAX_TAKEOVERS` times in a row without finishing (each one's claim was
    taken over after its lease ended): it is poisoned instead of being run again."""

    reason_code = "runs_died"


class DownstreamRejected(PermanentError):
    """A downstream service refused the request (a 4xx other than 408 and 429): the same request
    cannot succeed later. `status` is the HTTP status; the message has the start of the answer."""

    reason_code = "downstream_rejected"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class DestinationRefused(PermanentError):
    """The outbound guard refused the destination (loopback, private, link-local, the app's own
    storage, plain http:// to a host not in `HTTP_ALLOWED_HOSTS`): no connection was made."""

    reason_code = "destination_refused"


class TransientError(JobError):
    """May succeed later: retried with backoff, poisoned after the kind's attempts (MAX_ATTEMPTS).

    `retry_after_s`: the least delay the cause asked for (e.g. an answer's Retry-After), honoured
    up to the kind's retry cap."""

    reason_code = "transient"

    def __init__(self, message: str = "", retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DownstreamUnavailable(TransientError):
    """A downstream service answered 429/5xx or timed out."""


class StorageThrottled(TransientError):
    """Storage answered 503/500/429 (server busy)."""


class ClaimLost(JobError):
    """Our claim on the ledger was taken over (its lease ended): re-check instead of writing."""


class MessageTooLarge(Exception):
    """An envelope is too large even for claim check (API answers 413)."""
