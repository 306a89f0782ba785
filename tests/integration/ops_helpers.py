"""Run bulk operations' steps from the ops queue in-process, as the `run_op_step` trigger would."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from typing import Any

from shared.poison import bulk, bulk_step
from shared.runtime.wiring import Runtime
from shared.storage.memory_account import MemoryAccount
from tests.integration.backends import Backend
from tests.integration.helpers import queue_length


class SkippedTime:
    """The real time plus what sleeps skipped, for a runtime's pacing (`Runtime.sleep` and
    `.monotonic`): a sleep returns at once, moving the time to when its sleeper would wake, counted
    from what that thread last read (threads sleeping together: to the latest of their wake-ups,
    not their sum). A replay or a bulk step keeps its rate on it (item k starts k / rate after the
    first), at the shipped rates and budgets, without waiting them out."""

    def __init__(self) -> None:
        self.skipped = 0.0
        self._lock = threading.Lock()
        self._seen = threading.local()

    def monotonic(self) -> float:
        with self._lock:
            now = time.monotonic() + self.skipped
            self._seen.at = now
            return now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            wake = getattr(self._seen, "at", time.monotonic() + self.skipped) + max(0.0, seconds)
            self.skipped = max(self.skipped, wake - time.monotonic())


def paced_runtime(backend: Backend, **settings: str) -> Runtime:
    """The backend's runtime; on the in-memory account its replays and bulk steps pace on
    `SkippedTime` (on Azurite: the real time, as shipped)."""
    rt = backend.runtime(None, **settings)
    if backend.memory is not None:
        skipped = SkippedTime()
        rt.sleep, rt.monotonic = skipped.sleep, skipped.monotonic
    return rt


def ops_queue(rt: Runtime) -> str:
    return bulk.ops_queue_name(rt.settings.jobs_queue)


def read_op(rt: Runtime, op_id: str) -> dict[str, Any]:
    """The operation's record, which the test expects to exist."""
    doc = bulk.read(rt, op_id)
    assert doc is not None, f"no record for operation {op_id}"
    return doc


def take_steps(rt: Runtime, limit: int = 1000, on_step: Callable[[bytes], None] | None = None) -> int:
    """Receive step messages and run each (`on_step` instead, when given) until the queue is empty;
    a delayed next step is waited for (on an in-memory account, its time skips ahead instead).
    Returns the steps taken."""
    client = rt.account.raw_queue(ops_queue(rt))
    wait = rt.account.wait if isinstance(rt.account, MemoryAccount) else time.sleep
    taken = 0
    while taken < limit:
        batch = list(client.receive_messages(max_messages=1, visibility_timeout=60))
        if not batch:
            if queue_length(rt, ops_queue(rt)) == 0:
                return taken
            wait(0.2)
            continue
        msg = batch[0]
        body = base64.b64decode(msg.content)
        (on_step or (lambda b: bulk_step.run_step(rt, b)))(body)
        client.delete_message(msg)  # the host deletes it once the function returned
        taken += 1
    return taken
