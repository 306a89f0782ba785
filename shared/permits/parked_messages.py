"""Parking a waiting job's message (a port): put on the jobs queue invisible until its fallback
time, made visible at once when a release wakes it.

`QueueParking` sends and updates on the jobs queue (Azure Queue storage: one request each);
`MemoryParking` keeps them in a list (unit tests)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from shared.core.messages import NEVER_EXPIRE
from shared.permits.decide import Parked

if TYPE_CHECKING:
    from shared.storage.ports import Queue

log = logging.getLogger("jobs.permits")


class Parking(Protocol):
    def park(self, body: str, delay_s: int) -> Parked:
        """Put `body` on the jobs queue, visible after `delay_s` (its fallback re-check)."""

    def wake(self, parked: Parked) -> bool:
        """Make a parked message visible now; False when it is no longer parked (taken, gone)."""

    def cancel(self, parked: Parked) -> None:
        """Delete a parked message that is not needed any more (best effort)."""


class QueueParking:
    """Parked messages on the jobs queue (the `Queue` port: send, update, delete; its calls raise
    shared/storage/failures' errors)."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def park(self, body: str, delay_s: int) -> Parked:
        sent = self.queue.send_message(body, visibility_timeout=delay_s, time_to_live=NEVER_EXPIRE)
        return Parked(str(sent.id), str(sent.pop_receipt))

    def wake(self, parked: Parked) -> bool:
        from shared.storage.failures import StorageError

        try:
            self.queue.update_message(parked.message_id, parked.pop_receipt, visibility_timeout=0)
        except StorageError as exc:  # taken by its fallback delivery, or gone: it re-checks by itself
            log.info("parked message %s not woken (%s)", parked.message_id, exc.error_code or exc)
            return False
        return True

    def cancel(self, parked: Parked) -> None:
        from shared.storage.failures import StorageError

        try:
            self.queue.delete_message(parked.message_id, parked.pop_receipt)
        except StorageError as exc:  # its delivery then meets the job's record and is acknowledged
            log.info("parked message %s not deleted (%s)", parked.message_id, exc.error_code or exc)


@dataclass
class ParkedMessage:
    body: str
    visible_at: datetime
    parked: Parked
    woken: bool = False


class MemoryParking:
    """Parked messages in a list, on the given clock (unit tests)."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.clock = clock
        self.messages: list[ParkedMessage] = []
        self._lock = threading.Lock()

    def park(self, body: str, delay_s: int) -> Parked:
        with self._lock:
            parked = Parked(f"m{len(self.messages) + 1}", "r1")
            self.messages.append(ParkedMessage(body, self.clock() + timedelta(seconds=delay_s), parked))
            return parked

    def wake(self, parked: Parked) -> bool:
        with self._lock:
            for msg in self.messages:
                if msg.parked == parked:
                    msg.visible_at, msg.woken = self.clock(), True
                    return True
            return False

    def cancel(self, parked: Parked) -> None:
        with self._lock:
            self.messages = [m for m in self.messages if m.parked != parked]

    def due(self) -> list[ParkedMessage]:
        """The parked messages visible now, taken off the list (a delivery of each)."""
        with self._lock:
            now = self.clock()
            due = [m for m in self.messages if m.visible_at <= now]
            self.messages = [m for m in self.messages if m.visible_at > now]
            return due
