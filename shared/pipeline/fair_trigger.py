"""The job trigger's body under the fair share (several queues, `FAIR_SHARE` on; issue 46).

The trigger is `async def` (function_app.py): the job waits for a slot of its queue on the
worker's event loop, holding no thread of the worker's pool and writing nothing, then runs
`process_message` on the fair share's own threads (shared/pipeline/fair_share.py). Its deadline
counts from the invocation's start, the wait included (functionTimeout bounds both).

A job waits at most `MAX_WAIT_SHARE` of functionTimeout. Past that (a queue whose jobs are long
beside others), it leaves a copy of its message due in `OVER_SHARE_RECHECK_S` and is acknowledged
(decision `over_share`): its attempts untouched, its expiry still counting. A crash before the
copy is sent leaves the original message to come back after its lease; a crash between the send
and the host's delete leaves two messages of one job, which its claim runs once.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from shared.core.messages import QueueMessageLike
from shared.pipeline.fair_share import process_share
from shared.pipeline.processing import process_message
from shared.runtime.wiring import get_runtime

MAX_WAIT_SHARE = 0.5
"""The longest a job waits for a slot, as a share of functionTimeout: the rest is its run's."""


class InvocationContext(Protocol):
    """What the trigger's body uses of `azure.functions.Context`."""

    @property
    def invocation_id(self) -> str: ...

    @property
    def thread_local_storage(self) -> Any: ...


async def process_fairly(msg: QueueMessageLike, queue: str, context: InvocationContext | None = None) -> None:
    """Wait for a slot of `queue` (at most `MAX_WAIT_SHARE` of functionTimeout), then process the
    message on the fair share's pool; a job that waited its longest leaves a copy for later. With
    the invocation's `context`, the pool's thread logs under the invocation's id, as a sync
    function's thread does."""
    share, began = process_share(), time.monotonic()
    admitted = await share.acquire(queue, get_runtime().settings.function_timeout_s * MAX_WAIT_SHARE)

    def job() -> None:
        if context is not None:
            context.thread_local_storage.invocation_id = context.invocation_id
        waited_out = None if admitted else time.monotonic() - began
        process_message(msg, None, queue, began, waited_out)

    if admitted:
        await share.run_acquired(queue, job)
    else:
        await share.run_unslotted(job)
