"""Run bulk operations' steps from the ops queue in-process, as the `run_op_step` trigger would."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

from shared.poison import bulk, bulk_step
from shared.runtime.wiring import Runtime
from shared.storage.memory_account import MemoryAccount
from tests.integration.helpers import queue_length


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
