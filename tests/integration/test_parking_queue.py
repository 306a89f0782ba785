"""A waiting job's parked message on the `Queue` port (in memory and on Azurite): parked
invisible, woken at once by `update_message`, a wake of a message taken meanwhile says so (no
exception), a cancel deletes it; the permits container is created through the `Blobs` port."""

from __future__ import annotations

import pytest

from shared.core.envelope import decode_message
from shared.permits.parked_messages import QueueParking
from shared.permits.store import DocumentPermitStore
from shared.storage.failures import NotFound
from tests.integration.backends import Backend
from tests.integration.helpers import unique


def test_parked_message_is_invisible_then_woken_at_once(storage_backend: Backend) -> None:
    queue = storage_backend.account.queue(unique("jobs"))
    queue.create()
    parking = QueueParking(queue)
    parked = parking.park('{"id": "job-1"}', 600)
    assert queue.peek_messages(max_messages=5) == []  # invisible till its fallback time
    assert parking.wake(parked) is True
    [seen] = queue.receive_messages(max_messages=5, visibility_timeout=30)
    assert (seen.id, decode_message(str(seen.content).encode()).decode()) == (
        parked.message_id,
        '{"id": "job-1"}',
    )
    assert parking.wake(parked) is False  # taken meanwhile: its pop receipt is spent
    queue.delete_message(seen)


def test_cancel_deletes_a_parked_message(storage_backend: Backend) -> None:
    queue = storage_backend.account.queue(unique("jobs"))
    queue.create()
    parking = QueueParking(queue)
    parked = parking.park('{"id": "job-2"}', 1)
    parking.cancel(parked)
    storage_backend.wait(2)
    assert queue.peek_messages(max_messages=5) == []
    parking.cancel(parked)  # gone already: logged, not raised


def test_the_permit_store_creates_its_container_through_the_blobs_port(storage_backend: Backend) -> None:
    account = storage_backend.account
    name = unique("permits")
    store = DocumentPermitStore(account.documents(name), ensure=account.blobs(name).create)
    with pytest.raises(NotFound):
        account.blobs(name).check()
    store.note_waiting("job-3", {"key": "k"})  # the write meets no container: created, written again
    assert store.waiting_note("job-3") == {"key": "k"}
    account.blobs(name).create()  # one already there is no error
