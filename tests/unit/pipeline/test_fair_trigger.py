"""The job trigger's body under the fair share (shared/pipeline/fair_trigger.py): the job runs on
the fair share's pool under the invocation's id; one that waited its longest for a slot leaves a
copy of its message for later, writing nothing (its attempts untouched)."""

from __future__ import annotations

import asyncio
import base64
import threading
from types import SimpleNamespace
from typing import Any, cast

import azure.functions as func
import pytest

from shared.core.envelope import parse_dict
from shared.pipeline import fair_trigger
from shared.pipeline.fair_share import FairShare
from shared.pipeline.processing import process_message
from shared.runtime.sending import send_job
from tests.handlerkit import drain, kit_runtime


def context() -> SimpleNamespace:
    return SimpleNamespace(invocation_id="inv-1", thread_local_storage=threading.local())


def patch(monkeypatch: pytest.MonkeyPatch, share: FairShare, timeout_s: float) -> list[tuple[Any, ...]]:
    seen: list[tuple[Any, ...]] = []
    ctx_of_run = SimpleNamespace(settings=SimpleNamespace(function_timeout_s=timeout_s))

    def process(msg: object, rt: object, queue: str, began: float, waited_out: float | None) -> None:
        seen.append((msg, rt, queue, threading.current_thread().name.split("_")[0], waited_out))

    monkeypatch.setattr(fair_trigger, "process_message", process)
    monkeypatch.setattr(fair_trigger, "process_share", lambda: share)
    monkeypatch.setattr(fair_trigger, "get_runtime", lambda: ctx_of_run)
    return seen


def test_the_job_runs_on_the_pool_under_the_invocation_id(monkeypatch: pytest.MonkeyPatch) -> None:
    share, ctx = FairShare(2), context()
    seen = patch(monkeypatch, share, 600)
    ids: list[str] = []
    monkeypatch.setattr(
        fair_trigger,
        "process_message",
        lambda msg, rt, queue, began, waited: ids.append(ctx.thread_local_storage.invocation_id),
    )
    asyncio.run(fair_trigger.process_fairly(cast(Any, "message"), "gold", cast(Any, ctx)))
    assert ids == ["inv-1"] and seen == [] and share.running["gold"] == 0


def test_a_job_waits_at_most_half_the_function_timeout_then_leaves_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    share = FairShare(1)
    seen = patch(monkeypatch, share, 0.6)  # a 0.3-s wait at most

    async def scenario() -> None:
        assert await share.acquire("gold")  # the queue's only slot, held
        await fair_trigger.process_fairly(cast(Any, "message"), "gold", None)
        share.release("gold")
        await fair_trigger.process_fairly(cast(Any, "second"), "gold", None)

    asyncio.run(scenario())
    (first, second) = seen
    assert first[:4] == ("message", None, "gold", "fair-share") and first[4] >= 0.3  # waited out
    assert second == ("second", None, "gold", "fair-share", None)  # a slot: it runs
    assert share.running["gold"] == 0


def test_a_waited_out_delivery_leaves_a_copy_writes_nothing_and_the_copy_runs() -> None:
    kit = kit_runtime()
    send_job(kit.rt, parse_dict({"id": "late", "kind": "noop", "payload": {}}, ["noop"]))
    queue = kit.account.raw_queue(kit.rt.settings.jobs_queue)
    (msg,) = list(queue.receive_messages(max_messages=1, visibility_timeout=600))
    delivery = func.queue.QueueMessage(  # type: ignore[no-untyped-call]
        id=msg.id, body=base64.b64decode(msg.content), dequeue_count=msg.dequeue_count, pop_receipt="r"
    )
    process_message(delivery, kit.rt, None, None, waited_out_s=300.0)
    queue.delete_message(msg)  # the host acknowledges it
    assert kit.rt.ledger.get("late") is None  # no claim, no attempt spent
    assert drain(kit) == [pytest.approx(1.0, abs=0.01)]  # the copy, due in OVER_SHARE_RECHECK_S
    record = kit.rt.ledger.get("late")
    assert record is not None and record.data["status"] == "completed" and record.data["attempt"] == 0
