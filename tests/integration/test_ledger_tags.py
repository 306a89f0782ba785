"""Issue 21 on Azurite: the ledger's index tags ride on the record's own conditional writes, and
one Find Blobs by Tags request lists the claims that ended unfinished."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from devstack.azurite import Azurite
from shared import ledger
from shared.core.documents import TagQuery
from shared.core.envelope import Envelope, decode_message, parse_body
from shared.ledger import Facts
from shared.pipeline.recovery import ended_claims_query, recover_claims
from shared.storage.clients import clients_for
from tests.integration.helpers import runtime_for

pytestmark = pytest.mark.azurite


def test_tags_follow_each_write_and_recovery_resends_an_ended_claim(azurite: Azurite) -> None:
    rt = runtime_for(azurite)
    now = rt.clock()
    env = Envelope(id="tagged", kind="noop", created_at=now, payload={})
    facts = Facts(now - timedelta(seconds=60), "m1", 1, "dead-host/1")
    record = rt.ledger.write(env.id, None, lambda prev: ledger.claimed(prev, env, facts, 30.0))
    blob = (
        clients_for(rt.settings.storage)
        .container(rt.settings.ledger_container)
        .get_blob_client("tagged.json")
    )
    assert blob.get_blob_tags() == {"lease_until": record.data["lease_until"]}
    assert list(rt.ledger.store.find(ended_claims_query(now))) == ["tagged.json"]

    report = recover_claims(rt)
    assert report.resent == ["tagged"]
    [msg] = rt.account.raw_queue(rt.settings.jobs_queue).peek_messages()
    resent = parse_body(decode_message(msg.content.encode()))
    assert resent.to_dict() == replace(env, recorded=True).to_dict()  # its claim reads the record

    record = rt.ledger.write(
        env.id, record, lambda prev: ledger.completed(prev, env.id, Facts(now), 0, "", {}, 0.1)
    )
    assert blob.get_blob_tags() == {"state": "done", "done_at": record.data["finished_at"]}
    assert list(rt.ledger.store.find(ended_claims_query(now))) == []
    assert list(rt.ledger.store.find(TagQuery("state", "=", "done"))) == ["tagged.json"]
    assert recover_claims(rt).found == 0
