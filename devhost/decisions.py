"""Pure decisions of the queue trigger, mirroring the Storage Queues WebJobs extension.

Nothing here does I/O; the listener asks these functions what to do and then does it.
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections.abc import Callable
from dataclasses import dataclass

MIN_POLL_INTERVAL = 0.1  # QueuePollingIntervals.Minimum, also the backoff delta
RANDOMIZATION_FACTOR = 0.2
POISON_SUFFIX = "-poison"
MAX_QUEUE_NAME = 63


# --- polling backoff (RandomizedExponentialBackoffStrategy) -----------------------------------


@dataclass(frozen=True)
class Backoff:
    """State of the randomized exponential backoff; the initial state is Backoff()."""

    current: float = 0.0
    exponent: int = 0


def next_poll_delay(
    state: Backoff,
    found_since_last_delay: bool,
    maximum: float,
    uniform: Callable[[float, float], float],
    minimum: float = MIN_POLL_INTERVAL,
) -> tuple[float, Backoff]:
    """Delay before the next poll after an empty (or failed) poll, and the new state.

    Found a message since the last delay: reset to `minimum`. Otherwise
    minimum + U[0.8, 1.2) * 2^(k-1) * minimum, k growing per empty poll, capped at `maximum`
    (once at the cap it stays there). `uniform(a, b)` supplies the random factor.
    """
    if found_since_last_delay:
        return minimum, Backoff(minimum, 1)
    if state.current == maximum:
        return maximum, state
    interval = minimum
    if state.exponent > 0:
        factor = uniform(1.0 - RANDOMIZATION_FACTOR, 1.0 + RANDOMIZATION_FACTOR)
        interval += factor * 2.0 ** (state.exponent - 1) * minimum
    if interval < maximum:
        return interval, Backoff(interval, state.exponent + 1)
    return maximum, Backoff(maximum, state.exponent)


# --- poison queue and message handling --------------------------------------------------------


def poison_queue_name(queue: str) -> str | None:
    """`<queue>-poison`, or None when the queue has no poison queue (already poison, or too long)."""
    if queue.endswith(POISON_SUFFIX) or len(queue + POISON_SUFFIX) > MAX_QUEUE_NAME:
        return None
    return queue + POISON_SUFFIX


class Action(enum.Enum):
    CALL = "call"  # invoke the function
    DELETE = "delete"  # success: delete the message
    POISON = "poison"  # copy to <queue>-poison, then delete the original
    RELEASE = "release"  # UpdateMessage(visibility = host.json visibilityTimeout)
    LEAVE = "leave"  # do nothing: the message reappears when its lease expires


def before_call(dequeue_count: int, max_dequeue_count: int, has_poison_queue: bool) -> Action:
    """BeginProcessingMessageAsync: DequeueCount > max goes to poison without a call.

    Without a poison queue the real host neither calls nor releases (the message stays leased).
    """
    if dequeue_count > max_dequeue_count:
        return Action.POISON if has_poison_queue else Action.LEAVE
    return Action.CALL


def after_undecodable(has_poison_queue: bool) -> Action:
    """A body that is not valid base64: poison without a call (no poison queue: left leased)."""
    return Action.POISON if has_poison_queue else Action.LEAVE


def after_call(succeeded: bool, dequeue_count: int, max_dequeue_count: int, has_poison_queue: bool) -> Action:
    """CompleteProcessingMessageAsync."""
    if succeeded:
        return Action.DELETE
    if not has_poison_queue:
        return Action.LEAVE  # "leave the message invisible ... to prevent a fast infinite loop"
    if dequeue_count >= max_dequeue_count:
        return Action.POISON
    return Action.RELEASE


def decode_body(raw: str, encoding: str) -> bytes | None:
    """The message body as bytes, or None when `base64` encoding is set and the text is not base64."""
    if encoding == "none":
        return raw.encode("utf-8")
    compact = "".join(raw.split())  # .NET Convert.FromBase64String ignores whitespace
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        return None


def encode_body(data: bytes, encoding: str) -> str:
    """The raw message text the host sends for an output binding."""
    if encoding == "none":
        return data.decode("utf-8")
    return base64.b64encode(data).decode("ascii")


# --- storage error classification -------------------------------------------------------------

IGNORED_COMPLETION_ERRORS = {
    (400, "PopReceiptMismatch"),
    (404, "MessageNotFound"),
    (404, "QueueNotFound"),
    (409, "QueueBeingDeleted"),
    (409, "QueueDisabled"),
}


def is_ignorable_completion_error(status: int | None, error_code: str | None) -> bool:
    """Delete/release errors the real host logs and ignores (by status AND error code)."""
    return (status, error_code) in IGNORED_COMPLETION_ERRORS


def is_empty_poll_error(status: int | None, error_code: str | None) -> bool:
    """Receive errors treated like an empty queue (then backoff): QueueNotFound, being deleted, 5xx.

    `status` None means no HTTP response (connection refused, timeout): also treated as empty.
    """
    if status is None or status >= 500:
        return True
    return (status, error_code) in {
        (404, "QueueNotFound"),
        (409, "QueueBeingDeleted"),
        (409, "QueueDisabled"),
    }


class RenewOutcome(enum.Enum):
    OK = "ok"
    SERVER_ERROR = "server_error"  # 5xx or no response: retry sooner
    LOST = "lost"  # 400/404/409: ownership is gone, stop renewing


def classify_renew_error(status: int | None) -> RenewOutcome:
    if status in (400, 404, 409):
        return RenewOutcome.LOST
    return RenewOutcome.SERVER_ERROR


def next_renewal_interval(current: float, outcome: RenewOutcome, lease: float) -> float | None:
    """LinearSpeedupStrategy: normal = lease/2; on 5xx halve (floor lease/10); None = stop renewing."""
    normal = lease / 2
    if outcome is RenewOutcome.OK:
        return normal
    if outcome is RenewOutcome.LOST:
        return None
    return max(current / 2, lease / 10)
