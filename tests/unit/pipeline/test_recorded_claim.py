"""A message the app sent after making the job's record (`recorded`) is claimed with a GET and a
conditional replace, where trying to create the record first would cost a failed create too;
without a record it is created as for any producer's message."""

from __future__ import annotations

import pytest

from shared.core.envelope import parse_dict
from shared.core.errors import EnvelopeError
from shared.runtime.sending import send_job
from tests.handlerkit import drain, kit_runtime, submit_job


def blob_requests(requests: list[str]) -> list[str]:
    return [r.split(" ")[0] + " " + r.split("/")[-1] for r in requests if "/ledger/" in r]


def test_a_submitted_job_is_claimed_in_two_requests_where_a_producers_takes_three() -> None:
    kit = kit_runtime()
    submit_job(kit, "noop", {}, job_id="warm-up")
    drain(kit)
    before = len(kit.account.requests)
    submit_job(kit, "noop", {}, job_id="posted")
    posted = blob_requests(kit.account.requests[before:])
    assert posted == ["PUT posted.json", "PUT posted.json"]  # the POST: create, then clear
    before = len(kit.account.requests)
    drain(kit)
    claimed = blob_requests(kit.account.requests[before:])
    assert claimed == ["GET posted.json", "PUT posted.json", "PUT posted.json"]  # read, claim, complete
    record = kit.rt.ledger.get("posted")
    assert record is not None and record.data["status"] == "completed"


def test_a_recorded_message_without_a_record_creates_it_and_runs() -> None:
    kit = kit_runtime()
    env = parse_dict({"id": "lost-record", "kind": "noop", "payload": {}, "recorded": True}, ["noop"])
    assert env.recorded
    before = len(kit.account.requests)
    send_job(kit.rt, env)
    drain(kit)
    assert blob_requests(kit.account.requests[before:])[:2] == [
        "GET lost-record.json",
        "PUT lost-record.json",
    ]
    record = kit.rt.ledger.get("lost-record")
    assert record is not None and record.data["status"] == "completed"


def test_a_producers_message_is_claimed_by_creating_its_record() -> None:
    kit = kit_runtime()
    before = len(kit.account.requests)
    send_job(kit.rt, parse_dict({"id": "raw", "kind": "noop", "payload": {}}, ["noop"]))
    drain(kit)
    assert blob_requests(kit.account.requests[before:]) == [
        "PUT raw.json",
        "PUT raw.json",
    ]  # create, complete


def test_producers_may_not_say_recorded_and_retries_do() -> None:
    body = {"id": "x", "kind": "noop", "payload": {}, "recorded": True}
    with pytest.raises(EnvelopeError) as refused:
        parse_dict(body, ["noop"], producer=True)
    assert refused.value.problems == ["recorded: set by the app, not by producers"]
    env = parse_dict({"id": "x", "kind": "noop", "payload": {}}, ["noop"])
    assert not env.recorded and "recorded" not in env.to_dict()
    retry = env.with_attempt(1)
    assert retry.recorded and parse_dict(retry.to_dict(), ["noop"]).recorded
    with pytest.raises(EnvelopeError) as bad:
        parse_dict({"id": "x", "kind": "noop", "payload": {}, "recorded": "yes"}, ["noop"])
    assert bad.value.problems == ['recorded: must be true or false, got "yes"']
