"""The `Queue` port on an in-memory account's queues (`MemoryAccount`).

Faithful where the app relies on it, as Queue storage answers (tests/integration/test_port_contract.py
runs the same cases here and on Azurite): visibility timeouts on send, receive and update, dequeue
counts, pop receipts (a stale one is refused: 400 PopReceiptMismatch; a message gone: 404
MessageNotFound), time-to-live (-1: never), the 64 KiB limit, base64 queues (`queue`: text sent is
base64-encoded, as the Functions host reads it) and raw ones (`raw_queue`), and no decoding on
receive (as the app's clients). `receive_messages` takes one message a request, lazily, as the
SDK's pager does. Every call is one request in the account's log.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from shared.storage.memory_blobs import check_name, refused

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

NEVER = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
"""The expiry the service reports for a message put with time-to-live -1."""
MAX_MESSAGE_BYTES = 64 * 1024
DEFAULT_TTL_S = 7 * 24 * 3600
MAX_VISIBILITY_S = 7 * 24 * 3600
DEFAULT_LEASE_S = 30
"""The visibility timeout of a receive that names none."""


@dataclass
class StoredMessage:
    id: str
    text: str
    seq: int
    inserted_on: datetime
    expires_on: datetime
    visible_at: datetime
    pop_receipt: str
    dequeue_count: int = 0


@dataclass
class StoredQueue:
    name: str
    messages: dict[str, StoredMessage] = field(default_factory=dict)

    def live(self, now: datetime) -> list[StoredMessage]:
        """Messages not expired (expired ones are dropped), oldest first."""
        for gone in [m.id for m in self.messages.values() if m.expires_on <= now]:
            del self.messages[gone]
        return sorted(self.messages.values(), key=lambda m: m.seq)


@dataclass
class MemoryMessage:
    """A message as sent, peeked or received (the attributes of the SDK's `QueueMessage`)."""

    id: str
    content: Any
    inserted_on: datetime
    expires_on: datetime
    dequeue_count: int | None = None
    pop_receipt: str | None = None
    next_visible_on: datetime | None = None


def _seconds(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)


class QueueStore(Protocol):
    """What the queues' ports use of their account (`memory_account.MemoryAccount`)."""

    lock: threading.RLock
    queues: dict[str, StoredQueue]
    clock: Callable[[], datetime]

    def log(self, method: str, path: str) -> None: ...
    def next_seq(self) -> int: ...


class MemoryQueue:
    """One queue of a `MemoryAccount`; `encode`: base64 text is sent (as `Account.queue`)."""

    def __init__(self, account: QueueStore, name: str, encode: bool) -> None:
        self.account = account
        self._name = name
        self.encode = encode

    @property
    def name(self) -> str:
        return self._name

    def _stored(self, what: str) -> StoredQueue:
        found = self.account.queues.get(self._name)
        if found is None:
            raise refused(404, "QueueNotFound", what)
        return found

    def _text(self, content: Any) -> str:
        if not isinstance(content, str):
            raise TypeError(f"Message content must be text, not {type(content).__name__}")
        return base64.b64encode(content.encode("utf-8")).decode("ascii") if self.encode else content

    def _message(self, msg: StoredMessage, received: bool) -> MemoryMessage:
        return MemoryMessage(
            msg.id,
            msg.text,
            _seconds(msg.inserted_on),
            _seconds(msg.expires_on),
            msg.dequeue_count,
            msg.pop_receipt if received else None,
            _seconds(msg.visible_at) if received else None,
        )

    def send_message(
        self, content: Any, *, visibility_timeout: int | None = None, time_to_live: int | None = None
    ) -> MemoryMessage:
        text = self._text(content)
        delay = int(visibility_timeout or 0)
        ttl = DEFAULT_TTL_S if time_to_live is None else int(time_to_live)
        what = f"sending to queue {self._name}"
        with self.account.lock:
            self.account.log("POST", f"{self._name}/messages")
            queue = self._stored(what)
            if not 0 <= delay <= MAX_VISIBILITY_S or ttl == 0 or ttl < -1:
                raise refused(400, "OutOfRangeQueryParameterValue", what)
            if ttl != -1 and delay >= ttl:
                raise refused(400, "InvalidQueryParameterValue", what)
            if len(text.encode("utf-8")) > MAX_MESSAGE_BYTES:
                raise refused(413, "RequestBodyTooLarge", what)
            now = self.account.clock()
            msg = StoredMessage(
                id=str(uuid.uuid4()),
                text=text,
                seq=self.account.next_seq(),
                inserted_on=now,
                expires_on=NEVER if ttl == -1 else now + timedelta(seconds=ttl),
                visible_at=now + timedelta(seconds=delay),
                pop_receipt=uuid.uuid4().hex,
            )
            queue.messages[msg.id] = msg
            sent = self._message(msg, received=True)
            sent.content, sent.dequeue_count = content, None
            return sent

    def peek_messages(self, max_messages: int | None = None) -> list[MemoryMessage]:
        if max_messages and not 1 <= max_messages <= 32:
            raise ValueError("Number of messages to peek should be between 1 and 32")
        with self.account.lock:
            self.account.log("GET", f"{self._name}/messages")
            now = self.account.clock()
            live = self._stored(f"peeking at queue {self._name}").live(now)
            visible = [m for m in live if m.visible_at <= now][: max_messages or 1]
            return [self._message(m, received=False) for m in visible]

    def _take_one(self, lease: int) -> MemoryMessage | None:
        """One Get Messages request for one message."""
        what = f"receiving from queue {self._name}"
        with self.account.lock:
            self.account.log("GET", f"{self._name}/messages")
            queue = self._stored(what)
            if not 1 <= lease <= MAX_VISIBILITY_S:
                raise refused(400, "OutOfRangeQueryParameterValue", what)
            now = self.account.clock()
            msg = next((m for m in queue.live(now) if m.visible_at <= now), None)
            if msg is None:
                return None
            msg.dequeue_count += 1
            msg.pop_receipt = uuid.uuid4().hex
            msg.visible_at = now + timedelta(seconds=lease)
            return self._message(msg, received=True)

    def receive_messages(
        self, *, max_messages: int | None = None, visibility_timeout: int | None = None
    ) -> Iterator[MemoryMessage]:
        """Messages taken lazily, one a request, until `max_messages` or none is visible."""
        lease = DEFAULT_LEASE_S if visibility_timeout is None else visibility_timeout
        taken = 0
        while max_messages is None or taken < max_messages:
            msg = self._take_one(lease)
            if msg is None:
                return
            taken += 1
            yield msg

    def _held(self, message: Any, pop_receipt: str | None, what: str) -> StoredMessage:
        """The live message `message` (or its id) names, if `pop_receipt` (or its own) still holds it."""
        message_id = getattr(message, "id", message)
        receipt = pop_receipt or getattr(message, "pop_receipt", None)
        if receipt is None:
            raise ValueError("pop_receipt must be present")
        live = {m.id: m for m in self._stored(what).live(self.account.clock())}
        found = live.get(message_id)
        if found is None:
            raise refused(404, "MessageNotFound", what)
        if found.pop_receipt != receipt:
            raise refused(400, "PopReceiptMismatch", what)
        return found

    def delete_message(self, message: Any, pop_receipt: str | None = None) -> None:
        what = f"deleting a message of queue {self._name}"
        with self.account.lock:
            self.account.log("DELETE", f"{self._name}/messages/{getattr(message, 'id', message)}")
            found = self._held(message, pop_receipt, what)
            del self._stored(what).messages[found.id]

    def update_message(
        self,
        message: Any,
        pop_receipt: str | None = None,
        content: Any = None,
        *,
        visibility_timeout: int = 0,
    ) -> str:
        what = f"updating a message of queue {self._name}"
        text = content if content is not None else getattr(message, "content", None)
        with self.account.lock:
            self.account.log("PUT", f"{self._name}/messages/{getattr(message, 'id', message)}")
            if not 0 <= visibility_timeout <= MAX_VISIBILITY_S:
                raise refused(400, "OutOfRangeQueryParameterValue", what)
            found = self._held(message, pop_receipt, what)
            if text is not None:
                found.text = self._text(text)
            found.pop_receipt = uuid.uuid4().hex
            found.visible_at = self.account.clock() + timedelta(seconds=visibility_timeout)
            return found.pop_receipt

    def depth(self) -> int:
        with self.account.lock:
            self.account.log("GET", self._name)
            return len(self._stored(f"depth of queue {self._name}").live(self.account.clock()))

    def create(self) -> None:
        with self.account.lock:
            self.account.log("PUT", self._name)
            check_name(self._name, f"creating queue {self._name}")
            self.account.queues.setdefault(self._name, StoredQueue(self._name))

    def next_visible(self) -> datetime | None:
        """When the first message still waiting becomes visible (None: the queue is empty); a
        test double's clock skips to it."""
        with self.account.lock:
            live = self._stored(f"queue {self._name}").live(self.account.clock())
            return min((m.visible_at for m in live), default=None)
