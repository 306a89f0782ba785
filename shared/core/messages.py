"""Types shared by producers and consumers of queue messages (no app logic here)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol

NEVER_EXPIRE = -1
"""Message time-to-live meaning "never expires" (a job message must not vanish after 7 days)."""


class QueueMessageLike(Protocol):
    """What the host hands a queue trigger (azure.functions.QueueMessage satisfies it)."""

    @property
    def id(self) -> str | None: ...
    @property
    def dequeue_count(self) -> int | None: ...
    def get_body(self) -> bytes: ...


class QueueSender(Protocol):
    """The sending side of a queue (azure.storage.queue.QueueClient satisfies it)."""

    def send_message(
        self, content: Any, *, visibility_timeout: int | None = None, time_to_live: int | None = None
    ) -> Any: ...


class MessageQueue(QueueSender, Protocol):
    """A queue the app also reads (the poison queue: the sweeper and operators peek, receive and
    delete); azure.storage.queue.QueueClient satisfies it."""

    def peek_messages(self, max_messages: int | None = None) -> list[Any]: ...
    def receive_messages(
        self, *, max_messages: int | None = None, visibility_timeout: int | None = None
    ) -> Iterable[Any]: ...
    def delete_message(self, message: Any) -> None: ...


def inserted_at(msg: object) -> datetime | None:
    """When the queue message was first put (the host's `insertion_time`), if known and aware."""
    value = getattr(msg, "insertion_time", None)
    return value if isinstance(value, datetime) and value.tzinfo is not None else None
