"""The permit store and parking on a real Azurite: conditional writes between two instances,
storage requests per acquire + release, fencing of a paused holder, a killed holder's permit
back within the shipped lease (a fake clock keeps the shipped lease; the store is real)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.blob import ContainerClient
from azure.storage.queue import QueueClient

from devstack.azurite import Azurite
from shared.permits.decide import RESERVED_SHARE, Ticket
from shared.permits.limit import Limit
from shared.permits.limit_settings import read_permit_settings
from shared.permits.parked_messages import QueueParking
from shared.permits.service import Hold, PermitLost, Permits, Waiting
from shared.permits.store import DocumentPermitStore
from shared.storage.azure_blobs import AzureBlobs
from shared.storage.azure_queues import AzureQueue
from shared.storage.blob_documents import BlobDocuments
from tests.integration.helpers import unique

LEASE = read_permit_settings({}, "jobs").lease_s  # shipped: 30 s
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.s = 0.0

    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.s)

    def mono(self) -> float:
        return 1000.0 + self.s


class NoTimers:
    def call_later(self, delay_s: float, fn: Callable[[], None]) -> NoTimers:
        return self

    def cancel(self) -> None:
        return None


class Requests:
    def __init__(self) -> None:
        self.count = 0

    def hook(self, response: Any) -> None:
        self.count += 1


@pytest.fixture
def parts(azurite: Azurite) -> Iterator[tuple[ContainerClient, QueueClient, Requests]]:
    counted = Requests()
    container = ContainerClient.from_connection_string(
        azurite.connection_string, unique("permits"), raw_response_hook=counted.hook
    )
    queue = QueueClient.from_connection_string(azurite.connection_string, unique("jobs"))
    queue.create_queue()
    yield container, queue, counted
    container.delete_container()
    queue.delete_queue()


def instance(container: ContainerClient, queue: QueueClient, clock: Clock) -> Permits:
    store = DocumentPermitStore(BlobDocuments(container), ensure=AzureBlobs(container).create)
    return Permits(store, QueueParking(AzureQueue(queue)), clock.now, NoTimers(), LEASE, clock.mono)


def ticket(n: int) -> Ticket:
    return Ticket(f"job-{n}", T0 + timedelta(milliseconds=n), f"host-{n % 2}/{n}")


def test_two_instances_hold_at_most_n_and_acquire_plus_release_is_two_requests(parts) -> None:  # type: ignore[no-untyped-def]
    container, queue, counted = parts
    clock = Clock()
    a, b = instance(container, queue, clock), instance(container, queue, clock)
    limit = Limit("http:api.partner.example", 4)
    first = a.acquire([limit], ticket(0))  # creates the container and the key's document
    assert isinstance(first, Hold)
    first.release()
    counted.count = 0
    for n in range(1, 21):
        hold = a.acquire([limit], ticket(n))
        assert isinstance(hold, Hold)
        hold.release()
    assert counted.count == 40  # 2 a job: one conditional write to acquire, one to release
    holds = [inst.acquire([limit], ticket(n)) for n, inst in zip(range(30, 36), (a, b) * 3, strict=True)]
    granted = [h for h in holds if isinstance(h, Hold)]
    assert len(granted) == 4
    assert len(a.state(limit.key).holders) == 4


def test_a_paused_holder_whose_lease_was_taken_cannot_act(parts) -> None:  # type: ignore[no-untyped-def]
    container, queue, _ = parts
    clock = Clock()
    paused, other = instance(container, queue, clock), instance(container, queue, clock)
    limit = Limit("k", 1)
    hold = paused.acquire([limit], ticket(0))
    assert isinstance(hold, Hold)
    hold.fence()
    clock.s = 90  # SIGSTOP-like: the process does nothing for 90 s, past its 30-s lease
    taken = other.acquire([limit], ticket(1))
    assert isinstance(taken, Hold)
    with pytest.raises(PermitLost):
        hold.fence()
    hold.release()
    assert [h.job for h in other.state("k").holders] == ["job-1"]


def test_a_killed_holders_permit_is_back_within_the_lease_and_the_waiter_is_parked_till_then(parts) -> None:  # type: ignore[no-untyped-def]
    container, queue, _ = parts
    clock = Clock()
    killed, live = instance(container, queue, clock), instance(container, queue, clock)
    limit = Limit("k", 1)
    assert isinstance(killed.acquire([limit], ticket(0)), Hold)  # never released nor renewed
    waiting = live.acquire([limit], ticket(1))
    assert isinstance(waiting, Waiting)
    assert waiting.delay_s == int(LEASE) + 1 <= 60
    live.wait(waiting, ticket(1), '{"id": "job-1"}')
    assert queue.peek_messages() == []  # parked: invisible, nobody polls
    clock.s = waiting.delay_s
    assert isinstance(live.acquire([limit], ticket(1)), Hold)


def test_a_release_wakes_the_parked_waiter_at_once(parts) -> None:  # type: ignore[no-untyped-def]
    container, queue, _ = parts
    clock = Clock()
    a, b = instance(container, queue, clock), instance(container, queue, clock)
    limit = Limit("k", 1)
    hold = a.acquire([limit], ticket(0))
    assert isinstance(hold, Hold)
    waiting = b.acquire([limit], ticket(1))
    assert isinstance(waiting, Waiting)
    b.wait(waiting, ticket(1), '{"id": "job-1"}')
    assert b.waiting_reason("job-1") is not None
    assert "1 of 1 held by job-0" in str(b.waiting_reason("job-1"))
    started = time.monotonic()
    hold.release()
    seen: list[Any] = []
    while not seen and time.monotonic() - started < 5:
        seen = list(queue.receive_messages(max_messages=1))
    assert [m.content for m in seen] == ['{"id": "job-1"}']
    assert isinstance(b.acquire([limit], ticket(1)), Hold)
    assert b.waiting_reason("job-1") is None


def test_a_reservation_left_unused_sends_the_jobs_message_again(parts) -> None:  # type: ignore[no-untyped-def]
    container, queue, _ = parts
    clock = Clock()
    a, b = instance(container, queue, clock), instance(container, queue, clock)
    limit = Limit("k", 1)
    hold = a.acquire([limit], ticket(0))
    assert isinstance(hold, Hold)
    waiting = b.acquire([limit], ticket(1))
    assert isinstance(waiting, Waiting)
    b.wait(waiting, ticket(1), '{"id": "job-1"}')
    hold.release()  # wakes job-1: a host takes its message and is killed before it starts the job
    taken = list(queue.receive_messages(max_messages=5, visibility_timeout=600))
    assert [m.content for m in taken] == ['{"id": "job-1"}']
    clock.s = LEASE * RESERVED_SHARE + 1  # the reservation ended unused; the next write notices
    assert isinstance(a.acquire([limit], ticket(2)), Hold)
    again = list(queue.receive_messages(max_messages=5, visibility_timeout=30))
    assert [m.content for m in again] == ['{"id": "job-1"}']  # sent again, visible at once
    assert again[0].id != taken[0].id
