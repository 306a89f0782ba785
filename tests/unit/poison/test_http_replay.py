"""Edit before replay for an `http` job, on the kit (the fast tier's twin of the console's browser
test): a plain replay keeps the Idempotency-Key, an edited one gets a new key; the secret header
stays a reference everywhere the app keeps or shows the job; the job page shows each call."""

from __future__ import annotations

import base64
import json

import azure.functions as func

from shared.interfaces.console.actions import replay_edited
from shared.interfaces.console.pages import job_page
from shared.interfaces.console.queries import job_view
from shared.poison.handler import handle_poison_message
from shared.poison.replay import replay_jobs
from tests.handlerkit import (
    Kit,
    Receiver,
    Reply,
    allowing,
    assert_hidden,
    assert_sent,
    drain,
    kit_runtime,
    submit_job,
)

SECRET = "kit-partner-token-93c1e7"
HEADERS = {"Authorization": {"secret": "HTTP_SECRET_PARTNER"}}


def stored_text(kit: Kit) -> str:
    """Every blob and table entity of the account, archived bodies decoded."""
    parts: list[str] = []
    for container in kit.account.containers.values():
        for blob in container.blobs.values():
            text = blob.data.decode("utf-8", errors="replace")
            parts.append(text)
            try:
                inner = json.loads(text).get("body_b64")
            except (ValueError, AttributeError):
                inner = None
            if isinstance(inner, str):
                parts.append(base64.b64decode(inner).decode("utf-8", errors="replace"))
    for table in kit.account.table_service.data.values():
        parts.extend(json.dumps(e.props, default=str) for e in table.values())
    return "\n".join(parts)


def settle(kit: Kit) -> None:
    """Run the jobs queue dry, then hand each poison-queue message to the poison function (the
    host's `<queue>-poison` trigger): the job is archived, as the console lists it."""
    drain(kit)
    queue = kit.rt.poison_queue
    for msg in list(queue.receive_messages(max_messages=32, visibility_timeout=60)):
        body = base64.b64decode(msg.content)
        handle_poison_message(
            func.queue.QueueMessage(  # type: ignore[no-untyped-call]
                id=msg.id, body=body, dequeue_count=msg.dequeue_count, pop_receipt="r"
            ),
            kit.rt,
        )
        queue.delete_message(msg)


def test_a_plain_replay_keeps_the_key_an_edited_one_gets_a_new_key(receiver: Receiver) -> None:
    kit = kit_runtime(HTTP_SECRET_PARTNER=SECRET, **allowing(receiver.url(), "HTTP_SECRET_PARTNER"))
    receiver.reply(Reply(400, "amount is missing"), Reply(400, "amount is missing"))
    job = submit_job(kit, "http", {"url": receiver.url(), "headers": HEADERS, "body": {"order": 1}})
    settle(kit)
    assert kit.rt.ledger.get(job).status == "poisoned"  # type: ignore[union-attr]

    report = replay_jobs(kit.rt, [job], by="kit")
    assert report.replayed == [job]
    settle(kit)
    view = job_view(kit.rt, job)
    assert view is not None and view.record["status"] == "poisoned"
    assert view.envelope is not None and view.envelope["payload"]["headers"] == HEADERS

    edited = {**view.envelope, "payload": {**view.envelope["payload"], "body": {"order": 1, "amount": 5}}}
    replay_edited(kit.rt, job, json.dumps(edited), by="kit")
    settle(kit)

    first, plain, after_edit = receiver.requests
    assert plain.headers["Idempotency-Key"] == first.headers["Idempotency-Key"]
    assert after_edit.headers["Idempotency-Key"] != first.headers["Idempotency-Key"]
    assert len(receiver.requests) == 3
    assert_sent(SECRET, [r.headers["Authorization"] for r in receiver.requests])
    view = job_view(kit.rt, job)
    assert view is not None and view.record["status"] == "completed"
    page = job_page(view, "/api/console", job)
    assert [n.get("status") for n in view.record["downstream"]] == [400, 400, 200]
    assert "data-status='400'" in page and "data-status='200'" in page and "(replay 2)" in page
    assert "HTTP_SECRET_PARTNER" in stored_text(kit)  # the reference is kept: the archive, the edit
    assert_hidden(SECRET, stored_text(kit), page)
