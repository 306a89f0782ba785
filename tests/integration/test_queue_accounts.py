"""A queue in another storage account (QUEUE_<NAME>_CONNECTION), on one Azurite serving two
accounts (`AZURITE_ACCOUNTS`, devstack/azurite.py): producers' messages, the trigger's queue, the
poison copy and a replay stay in that account; the queue metrics and the console's table of
queues read it there; the ledger, results and archive stay in the app's account."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import azure.functions as func
import pytest
from azure.storage.queue import QueueServiceClient

from devstack.azurite import DEV_ACCOUNT, DEV_KEY, Azurite, accounts_setting, parse_accounts, start_azurite
from devstack.up import create_other_account_queues, queue_lines
from shared import poison
from shared.interfaces import api
from shared.interfaces.console import by_queue
from shared.observability import queue_metrics
from shared.pipeline.processing import process_message
from shared.queues import read_queues
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend
from tests.integration.helpers import message, unique

pytestmark = [pytest.mark.integration, pytest.mark.azurite]
PARTNER_KEY = base64.b64encode(b"partner-account-key-for-tests-only").decode()


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """This module's Azurite, serving a second account `partner` beside the development one."""
    az = start_azurite(
        accounts=(("partner", PARTNER_KEY),), log_path=tmp_path_factory.mktemp("az") / "az.log"
    )
    try:
        yield az
    finally:
        az.cleanup()


@pytest.fixture
def rt(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    first, gold = unique("jobs"), unique("gold")
    partner = QueueServiceClient.from_connection_string(azurite.account_connection_string("partner"))
    for name in (gold, f"{gold}-poison"):  # the queue's owner creates them (ensure_resources does not)
        partner.create_queue(name)
    runtime = Backend.on_azurite(azurite).runtime(
        None,
        JOBS_QUEUES=f"{first},{gold}",
        PARTNER=azurite.account_connection_string("partner"),
        **{f"QUEUE_{gold.upper()}_CONNECTION": "PARTNER", f"QUEUE_{gold.upper()}_MAX_ATTEMPTS": "1"},
    )
    monkeypatch.setattr(api, "get_runtime", lambda: runtime)
    yield runtime


def partner_queue(azurite: Azurite, name: str) -> Any:
    return QueueServiceClient.from_connection_string(
        azurite.account_connection_string("partner")
    ).get_queue_client(name)


def take(azurite: Azurite, name: str) -> list[bytes]:
    queue = partner_queue(azurite, name)
    bodies = []
    for msg in queue.receive_messages(max_messages=32, visibility_timeout=30):
        bodies.append(base64.b64decode(msg.content))
        queue.delete_message(msg)
    return bodies


def submit(body: dict[str, Any]) -> int:
    req = func.HttpRequest(
        "POST", "http://localhost/api/jobs", body=json.dumps(body).encode(), headers={}, params={}
    )
    return int(api.submit_job(req).status_code)


def test_the_accounts_setting_lists_the_development_account_first() -> None:
    assert parse_accounts("a:k1:k2; b:k3") == (("a", "k1"), ("b", "k3"))
    assert accounts_setting((("a", "k1"),)) == f"{DEV_ACCOUNT}:{DEV_KEY};a:k1"
    with pytest.raises(ValueError, match="not name:key"):
        parse_accounts("broken")


def test_a_queue_in_another_account_works_there_end_to_end(rt: Runtime, azurite: Azurite) -> None:
    first, gold = rt.settings.queue_set.names
    in_app = {
        q.name for q in QueueServiceClient.from_connection_string(azurite.connection_string).list_queues()
    }
    assert gold not in in_app and f"{gold}-parked" in in_app  # parked copies stay in the app's account
    assert submit({"id": "a-1", "kind": "fault", "payload": {"permanent": True}, "queue": gold}) == 202
    samples = {(s.name, s.queue): s for s in queue_metrics.sample(rt)}
    assert samples[(gold, "jobs")].depth == 1 and samples[(first, "jobs")].depth == 0
    [row] = [r for r in by_queue.queue_rows(rt) if r.name == gold]
    assert (row.depth, row.account) == (1, "PARTNER")
    [body] = take(azurite, gold)
    process_message(message(body), rt, queue=gold)  # poisoned at once (MAX_ATTEMPTS 1)
    [copy] = take(azurite, f"{gold}-poison")
    poison.handle_poison_message(message(copy), rt, queue=gold)
    record = rt.for_queue(gold).ledger.get("a-1")
    assert record is not None and record.status == "poisoned"  # the ledger: the app's account
    report = poison.replay_jobs(rt, [f"{gold}/a-1"], "t")
    assert report.replayed == [f"{gold}/a-1"]
    assert [json.loads(b)["id"] for b in take(azurite, gold)] == ["a-1"]


def test_make_up_creates_a_queue_of_another_account_there(azurite: Azurite) -> None:
    first, gold = unique("jobs"), unique("gold")
    env = {
        "AzureWebJobsStorage": azurite.connection_string,
        "JOBS_QUEUES": f"{first},{gold}",
        "PARTNER": azurite.account_connection_string("partner"),
        f"QUEUE_{gold.upper()}_CONNECTION": "PARTNER",
    }
    queues = read_queues(env)
    assert create_other_account_queues(env, queues) == [f"{gold} (PARTNER)"]
    assert create_other_account_queues(env, queues) == [f"{gold} (PARTNER)"], "again: already there"
    partner = QueueServiceClient.from_connection_string(env["PARTNER"])
    assert {gold, f"{gold}-poison"} <= {q.name for q in partner.list_queues(name_starts_with=gold)}
    assert (
        queue_lines(queues, [f"{gold} (PARTNER)"])
        == f"  Job queues     {first} (default), {gold} (PARTNER)\n"
    )
