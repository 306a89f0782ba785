"""SPARK_MAX_CONCURRENT_RUNS: slot records on a real Azurite, and jobs over the cap that wait.

The slot lease is the shipped one (3 x SPARK_POLL_MAX_SECONDS + the step budget + 10 minutes);
its expiry is shown with an injected clock, not by waiting.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from devstack.azurite import Azurite
from shared.core.errors import PermanentError
from shared.jobs import aggregate
from shared.jobs.base import Completed, Continue
from shared.jobs.offload.abandon import abandon_work
from shared.jobs.offload.aggregate_spark import offload, resume
from shared.jobs.offload.runs import slots_for
from shared.spark.livy import LivyBackend
from shared.spark.slots import Slots, is_free_for, lease_seconds
from shared.storage.accounts import AzureAccount
from shared.storage.blob_documents import BlobDocuments
from tests.spark.fakes import FakeLivy
from tests.spark.helpers import PAYLOAD, make_ctx, settings_for, storage_for, unique

pytestmark = pytest.mark.integration


def test_a_slot_is_free_when_empty_ours_released_or_lapsed() -> None:
    assert is_free_for(None, "a", 100.0)
    assert is_free_for({"holder": None, "until": 0}, "a", 100.0)
    assert is_free_for({"holder": "a", "until": 200.0}, "a", 100.0)
    assert not is_free_for({"holder": "b", "until": 200.0}, "a", 100.0)
    assert is_free_for({"holder": "b", "until": 99.0}, "a", 100.0)
    assert lease_seconds(300, 150) == 1650  # shipped polling cap and step budget: 27.5 minutes


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(azurite: Azurite) -> BlobDocuments:
    settings = settings_for(azurite, {})
    return BlobDocuments(storage_for(settings).container(settings.ledger_container))


def test_slots_cap_release_and_reclaim_after_a_holder_dies(store: BlobDocuments) -> None:
    clock = Clock()
    slots = Slots(store, cap=2, lease_s=lease_seconds(300, 150), clock=clock)
    a, b = slots.acquire("job-a"), slots.acquire("job-b")
    assert {a, b} == {0, 1}
    assert slots.acquire("job-c") is None
    assert slots.acquire("job-a") == a  # taking it again (a retried step) keeps the same slot
    slots.release("job-b", b)
    clock.now += 1000
    assert slots.acquire("job-c") == b
    # job-a's holder dies: nobody renews; the slot is taken again only once its lease has passed
    clock.now += 649
    assert slots.acquire("job-d") is None
    clock.now += 2
    assert slots.acquire("job-d") == a
    assert not slots.renew("job-a", a)  # the late holder learns it lost the slot
    assert sorted(h or "" for h in slots.holders()) == ["job-c", "job-d"]


def test_instances_racing_for_the_last_slot_get_it_once(store: BlobDocuments) -> None:
    winners: list[str] = []
    barrier = threading.Barrier(6)

    def take(job: str) -> None:
        barrier.wait()
        if Slots(store, cap=1, lease_s=1650).acquire(job) is not None:
            winners.append(job)

    threads = [threading.Thread(target=take, args=(f"job-{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1


def capped_livy_env(livy: FakeLivy) -> dict[str, str]:
    """The fake Livy with room for one run at a time."""
    return {
        "SPARK_BACKEND": "livy", "SPARK_URL": livy.url, "SPARK_JOB_FILE": "abfss://j@a.dfs.core.windows.net/x.py",
        "SPARK_LIVY_AUTH": "basic", "SPARK_LIVY_USER": "admin", "SPARK_LIVY_PASSWORD": "pw",
        "SPARK_MAX_CONCURRENT_RUNS": "1",
    }  # fmt: skip


@pytest.fixture
def livy() -> Iterator[FakeLivy]:
    server = FakeLivy(auth="basic")
    yield server
    server.stop()


def test_a_job_over_the_cap_waits_then_runs_and_completes(azurite: Azurite, livy: FakeLivy) -> None:
    settings = settings_for(azurite, capped_livy_env(livy))
    storage = storage_for(settings)
    backend = LivyBackend(settings.spark)
    results = storage.container(settings.results_container)

    def finish(job_id: str, batch: int) -> None:
        livy.set_state(batch, "success")
        doc = {"id": job_id, "rows": [], "input_rows": 0, "engine": "spark", "elapsed_s": 1.0}
        results.upload_blob(f"{job_id}.json", json.dumps(doc))

    first = make_ctx(settings, storage, PAYLOAD, unique("job-a-"))
    second = make_ctx(settings, storage, PAYLOAD, unique("job-b-"))
    a = offload(first, backend=backend)
    b = offload(second, backend=backend)
    assert isinstance(a, Continue) and a.state["submission_id"] == "0" and a.state["slot"] == 0
    assert isinstance(b, Continue) and b.state["submissions"] == 0 and b.state["submission_id"] is None
    assert livy.count("POST", "/batches") == 1  # the second job was not submitted
    second.resume_state = b.state
    b = resume(second, backend=backend)  # still full: waits longer, no attempt spent
    assert isinstance(b, Continue) and b.state["submissions"] == 0 and b.delay_s > a.delay_s

    finish(first.job_id, 0)
    first.resume_state = a.state
    assert isinstance(resume(first, backend=backend), Completed)  # its slot is freed
    second.resume_state = b.state
    b = resume(second, backend=backend)
    assert isinstance(b, Continue) and b.state["submission_id"] == "1" and b.state["submissions"] == 1
    finish(second.job_id, 1)
    second.resume_state = b.state
    done = resume(second, backend=backend)
    assert isinstance(done, Completed) and done.summary["submissions"] == 1
    assert livy.count("POST", "/batches") == 2
    assert slots_for(settings, AzureAccount(storage, settings.storage)).holders() == [None]


def test_a_poisoned_job_frees_its_slot(azurite: Azurite, livy: FakeLivy) -> None:
    settings = settings_for(azurite, capped_livy_env(livy))
    storage = storage_for(settings)
    ctx = make_ctx(settings, storage, PAYLOAD)
    out = offload(ctx, backend=LivyBackend(settings.spark))
    assert isinstance(out, Continue)
    assert slots_for(settings, AzureAccount(storage, settings.storage)).holders() == [ctx.job_id]
    record = {"id": ctx.job_id, "continuation": {"seq": 1, "state": out.state}}
    run = abandon_work(aggregate.HANDLER, settings, AzureAccount(storage, settings.storage), record, None)
    assert run is not None and run["cancelled"] is True and livy.batches[0]["state"] == "killed"
    assert slots_for(settings, AzureAccount(storage, settings.storage)).holders() == [None]


def test_release_finds_the_slot_when_the_saved_index_is_stale(store: BlobDocuments) -> None:
    slots = Slots(store, cap=3, lease_s=1650)
    held = slots.acquire("job-a")
    assert held is not None
    slots.release("job-a", (held + 1) % 3)  # a stale hint: the slot actually held is found
    assert slots.holders() == [None, None, None]
    other = slots.acquire("job-b")
    slots.release("job-a", other)  # someone else's slot is left alone
    assert slots.holders().count("job-b") == 1


def test_a_refused_submit_frees_the_slot_it_took(azurite: Azurite, livy: FakeLivy) -> None:
    settings = settings_for(azurite, capped_livy_env(livy))
    storage = storage_for(settings)
    livy.create_status = 400
    with pytest.raises(PermanentError, match="HTTP 400 on POST /batches"):
        offload(make_ctx(settings, storage, PAYLOAD), backend=LivyBackend(settings.spark))
    assert slots_for(settings, AzureAccount(storage, settings.storage)).holders() == [None]
