"""The storage ports' behaviour the app relies on, asserted the same way on the in-memory account
(`shared.storage.memory_account.MemoryAccount`, in `make test-fast`) and on the Azure adapters
over Azurite (`AzureAccount`, in `make test`): the in-memory ports cannot drift from the service
without one of these failing on one side. `[sdk]` runs the Azure adapters themselves in the fast
tier, on the SDK-imitating fake (tests/fakes/storage/, held to Azurite by test_storage_contract.py).
Tables: tests/integration/test_table_port.py.

Time: the in-memory variant moves a manual clock; the Azurite one sleeps (1-second timeouts).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest

from shared.blobio.reader import BlobChanged
from shared.blobio.stream import Range
from shared.config.settings import Settings
from shared.core.documents import DocumentChanged, DocumentExists, TagQuery
from shared.core.envelope import decode_message
from shared.core.errors import InputMissing
from shared.core.messages import NEVER_EXPIRE
from shared.storage.failures import (
    GONE_MESSAGE_CODES,
    AlreadyExists,
    ConditionFailed,
    NotFound,
    StorageError,
    is_throttled,
)
from shared.storage.limits import BlobTooLarge
from shared.storage.memory_account import ManualClock, MemoryAccount, real_time
from shared.storage.ports import Account, Blobs, Queue
from tests.integration.helpers import unique
from tests.storage_params import STORAGE_BACKENDS

SDK = "sdk"
"""The Azure adapters (`AzureAccount`) on the SDK-imitating fake: their own tests, in the fast tier."""


@dataclass
class Side:
    """One account under test, and how to let its time pass."""

    account: Account
    wait: Callable[[float], None]
    over_http: bool = True
    """False: ranged reads (`Blobs.ranges`, HTTP in shared/blobio) have no service to reach."""


@pytest.fixture(params=[*STORAGE_BACKENDS, pytest.param(SDK, id=SDK)])
def side(request: pytest.FixtureRequest) -> Side:
    if request.param == SDK:
        from shared.config.settings import StorageConnection
        from shared.storage.accounts import AzureAccount
        from tests.fakes.storage import MemoryStorage

        fake = ManualClock(real_time())
        clients = MemoryStorage(fake).clients()
        connection = StorageConnection(connection_string="UseDevelopmentStorage=true")
        return Side(AzureAccount(clients, connection), fake.advance, over_http=False)
    if request.param == "azurite":
        from shared.storage.accounts import account_for

        azurite = request.getfixturevalue("azurite")
        settings = Settings.from_env({"AzureWebJobsStorage": azurite.connection_string})
        return Side(account_for(settings.storage), time.sleep)
    clock = ManualClock(real_time())
    return Side(MemoryAccount(clock), clock.advance)


@pytest.fixture
def blobs(side: Side) -> Blobs:
    made = side.account.blobs(unique("contract"))
    made.create()
    made.create()  # one already there is no error
    return made


@pytest.fixture
def queue(side: Side) -> Queue:
    made = side.account.raw_queue(unique("contract"))
    made.create()
    made.create()
    return made


def failure(exc: StorageError) -> tuple[str, int | None, str | None]:
    return type(exc).__name__, exc.status_code, exc.error_code


# -- blobs ------------------------------------------------------------------------------------


def test_a_blob_is_written_whole_and_overwrite_false_refuses_an_existing_one(blobs: Blobs) -> None:
    blobs.write("a.json", b"1", content_type="application/json", overwrite=False)
    with pytest.raises(AlreadyExists) as refused:
        blobs.write("a.json", "2", overwrite=False)
    assert failure(refused.value) == ("AlreadyExists", 409, "BlobAlreadyExists")
    assert blobs.read("a.json") == b"1"
    blobs.write("a.json", "é")
    assert blobs.read("a.json") == "é".encode()


def test_missing_blobs_and_containers(side: Side, blobs: Blobs) -> None:
    with pytest.raises(NotFound) as missing:
        blobs.read("none")
    assert failure(missing.value) == ("NotFound", 404, "BlobNotFound")
    assert blobs.exists("none") is False
    assert blobs.delete("none") is False
    blobs.check()
    gone = side.account.blobs(unique("nocontainer"))
    for call in (lambda: gone.read("a"), lambda: gone.write("a", b"1"), gone.check):
        with pytest.raises(NotFound) as missing:
            call()
        assert failure(missing.value) == ("NotFound", 404, "ContainerNotFound")
    assert gone.exists("a") is False
    with pytest.raises(NotFound):
        next(gone.pages())


def test_ranged_reads_under_an_etag(blobs: Blobs) -> None:
    blobs.write("ten", b"0123456789")
    part, etag = blobs.read_range("ten", 2, 4)
    assert part == b"2345" and etag
    assert blobs.read_range("ten", 8, 100, etag) == (b"89", etag)
    blobs.write("ten", b"changed")
    with pytest.raises(ConditionFailed) as changed:
        blobs.read_range("ten", 0, 4, etag)
    assert failure(changed.value) == ("ConditionFailed", 412, "ConditionNotMet")
    with pytest.raises(StorageError) as beyond:
        blobs.read_range("ten", 50, 4)
    assert beyond.value.status_code == 416


def test_capped_reads_refuse_a_larger_blob_with_its_size(blobs: Blobs) -> None:
    blobs.write("ten", b"0123456789")
    blobs.write("empty", b"")
    assert blobs.read_capped("ten", 10) == b"0123456789"
    with pytest.raises(BlobTooLarge) as large:
        blobs.read_capped("ten", 9)
    assert (large.value.size, large.value.limit) == (10, 9)
    assert blobs.read_capped("empty", 10) == b""
    with pytest.raises(NotFound):
        blobs.read_capped("none", 10)


def test_delete_unless_written_after(blobs: Blobs) -> None:
    blobs.write("old", b"")
    [[listed]] = list(blobs.pages())
    assert listed.last_modified is not None and listed.size == 0
    assert blobs.delete("old", unmodified_since=listed.last_modified - timedelta(seconds=5)) is False
    assert blobs.exists("old")
    assert blobs.delete("old", unmodified_since=listed.last_modified + timedelta(seconds=5)) is True
    assert not blobs.exists("old")


def test_listing_by_prefix_in_pages_in_name_order(blobs: Blobs) -> None:
    for name in ("jobs/b", "jobs/a", "unparsed/x", "jobs/c"):
        blobs.write(name, b"{}")
    pages = [[(b.name, b.size) for b in page] for page in blobs.pages("jobs/", size=2)]
    assert pages == [[("jobs/a", 2), ("jobs/b", 2)], [("jobs/c", 2)]]
    assert sum(len(p) for p in blobs.pages()) == 4


def test_staged_writes_become_the_blob_only_when_committed(blobs: Blobs) -> None:
    blobs.write("staged", b"before")
    out = blobs.writer("staged", "text/csv", block_bytes=4)
    assert out.write(b"abcdefghij") == 10 and out.blocks == 2 and out.size == 10
    assert blobs.read("staged") == b"before", "nothing is visible before the commit"
    assert out.commit() == 10 and out.blocks == 3
    assert blobs.read("staged") == b"abcdefghij"
    again = blobs.writer("staged", "text/csv", block_bytes=4)
    again.write(b"XYZ")
    again.commit()
    assert blobs.read("staged") == b"XYZ", "replaced whole"


def test_ranges_read_parts_under_the_first_etag(side: Side, blobs: Blobs) -> None:
    if not side.over_http:
        pytest.skip("the SDK fake has no HTTP endpoint for shared/blobio's ranged GETs")
    blobs.write("ten", b"0123456789")
    blobs.write("empty", b"")
    ranges = blobs.ranges("ten")
    view = memoryview(bytearray(4))
    got = ranges.get_into(view, 0, None)
    assert (bytes(view), got.length, got.size) == (b"0123", 4, 10)
    tail = ranges.get_into(view, 8, got.etag)
    assert (bytes(view[: tail.length]), tail.size, tail.etag) == (b"89", 10, got.etag)
    assert blobs.ranges("empty").get_into(view, 0, None).length == 0
    blobs.write("ten", b"changed")
    with pytest.raises(BlobChanged):
        ranges.get_into(view, 0, got.etag)
    with pytest.raises(InputMissing):
        blobs.ranges("none").get_into(view, 0, None)
    assert isinstance(got, Range)


def test_documents_answer_conflicts_and_are_the_containers_blobs(side: Side, blobs: Blobs) -> None:
    docs = side.account.documents(blobs.name, tags=lambda d: {"state": str(d["s"])} if "s" in d else {})
    made = docs.create("x.json", {"s": "a"})
    with pytest.raises(DocumentExists):
        docs.create("x.json", {"s": "b"})
    changed = docs.replace("x.json", made, {"s": "b"})
    with pytest.raises(DocumentChanged):
        docs.replace("x.json", made, {"s": "c"})
    read = docs.read("x.json")
    assert read is not None and read.data == {"s": "b"} and read.etag == changed.etag
    assert json.loads(blobs.read("x.json")) == {"s": "b"}, "a document is a JSON blob"
    docs.upsert("y.json", {"s": "b"})
    assert sorted(docs.find(TagQuery("state", "=", "b"))) == ["x.json", "y.json"]
    docs.upsert("y.json", {"other": 1})  # none given: the write clears its tags
    assert list(docs.find(TagQuery("state", "=", "b"))) == ["x.json"]
    assert [name for name, modified in docs.names("y") if modified is not None] == ["y.json"]
    blobs.write("z.json", b"not json")
    unreadable = docs.read("z.json")
    assert unreadable is not None and unreadable.data == {"unreadable": True}
    docs.delete("x.json")
    docs.delete("x.json")  # a missing document is not an error
    assert docs.read("x.json") is None
    with pytest.raises(DocumentChanged):
        docs.replace("x.json", changed, {"s": "d"})
    assert docs.read("none.json") is None


def test_documents_fail_with_the_apps_own_storage_errors(side: Side) -> None:
    """No SDK error leaves a document store: its callers need no wrapper."""
    docs = side.account.documents(unique("nocontainer"))
    assert docs.read("a.json") is None
    docs.delete("a.json")  # nothing to delete: no error
    for call in (
        lambda: docs.create("a.json", {}),
        lambda: docs.upsert("a.json", {}),
        lambda: list(docs.names("")),
    ):
        with pytest.raises(NotFound) as missing:
            call()
        assert failure(missing.value) == ("NotFound", 404, "ContainerNotFound")


def test_names_and_index_tags_the_service_refuses(side: Side, blobs: Blobs) -> None:
    for bad, code in (
        ("Upper", "InvalidResourceName"),
        ("a--b", "InvalidResourceName"),
        ("ab", "OutOfRangeInput"),
    ):
        for create in (side.account.blobs(bad).create, side.account.raw_queue(bad).create):
            with pytest.raises(StorageError) as refused:
                create()
            assert (refused.value.status_code, refused.value.error_code) == (400, code)
    docs = side.account.documents(blobs.name, tags=lambda d: {str(k): str(v) for k, v in d.items()})
    docs.upsert("ok.json", {"k": "a b+-./:=_"})
    for tags in ({"k": "a*b"}, {"a$": "v"}, {f"k{i}": "v" for i in range(11)}, {"k": "x" * 257}):
        with pytest.raises(StorageError) as refused:  # the codes differ: Azurite's are its own
            docs.upsert("t.json", tags)
        assert refused.value.status_code == 400
    assert docs.read("t.json") is None, "nothing written"


def test_find_by_tags_compares_strings_in_order(side: Side, blobs: Blobs) -> None:
    docs = side.account.documents(blobs.name, tags=lambda d: {"lease": d["lease"]} if d else {})
    for name, lease in (("a", "2026-01-01T00:00:01Z"), ("b", "2026-01-01T00:00:03Z"), ("c", "2026-01-01")):
        docs.upsert(name, {"lease": lease})
    docs.upsert("untagged", {})
    assert sorted(docs.find(TagQuery("lease", "<", "2026-01-01T00:00:02Z"))) == ["a", "c"]
    assert sorted(
        n for page in blobs.found(TagQuery("lease", ">", "2026-01-01T00:00:02Z")) for n in page
    ) == ["b"]


# -- queues -----------------------------------------------------------------------------------


def test_a_message_not_deleted_comes_back_after_its_visibility_timeout(side: Side, queue: Queue) -> None:
    queue.send_message("m1")
    [first] = list(queue.receive_messages(max_messages=32, visibility_timeout=1))
    assert first.content == "m1" and first.dequeue_count == 1 and first.pop_receipt
    assert list(queue.receive_messages(max_messages=32, visibility_timeout=1)) == [], "invisible while leased"
    assert queue.depth() == 1, "counted while invisible"
    side.wait(1.5)
    [again] = list(queue.receive_messages(max_messages=32, visibility_timeout=30))
    assert (again.id, again.content, again.dequeue_count) == (first.id, "m1", 2)
    assert again.pop_receipt != first.pop_receipt
    with pytest.raises(StorageError) as stale:
        queue.delete_message(first)  # the first receipt is spent
    assert failure(stale.value) == ("StorageError", 400, "PopReceiptMismatch")
    assert stale.value.error_code in GONE_MESSAGE_CODES
    queue.delete_message(again.id, again.pop_receipt)
    with pytest.raises(NotFound) as gone:
        queue.delete_message(again)
    assert failure(gone.value) == ("NotFound", 404, "MessageNotFound")
    assert queue.depth() == 0


def test_update_moves_visibility_and_spends_the_receipt(queue: Queue) -> None:
    queue.send_message("u1")
    [taken] = list(queue.receive_messages(max_messages=1, visibility_timeout=600))
    assert queue.peek_messages(max_messages=32) == []
    receipt = queue.update_message(taken.id, taken.pop_receipt, visibility_timeout=0)
    assert receipt and receipt != taken.pop_receipt
    [peeked] = queue.peek_messages(max_messages=32)
    assert (peeked.id, peeked.content, peeked.dequeue_count) == (taken.id, "u1", 1), "not a delivery"
    with pytest.raises(StorageError) as stale:
        queue.update_message(taken.id, taken.pop_receipt, visibility_timeout=0)
    assert failure(stale.value) == ("StorageError", 400, "PopReceiptMismatch")
    later = queue.update_message(taken.id, receipt, "u2", visibility_timeout=600)
    assert queue.peek_messages(max_messages=32) == [] and queue.depth() == 1
    queue.update_message(taken.id, later, visibility_timeout=0)
    [changed] = list(queue.receive_messages(max_messages=1, visibility_timeout=30))
    assert (changed.content, changed.dequeue_count) == ("u2", 2)
    queue.delete_message(changed)
    with pytest.raises(NotFound) as gone:
        queue.update_message(changed.id, changed.pop_receipt, visibility_timeout=0)
    assert failure(gone.value) == ("NotFound", 404, "MessageNotFound")


def test_peek_shows_dequeue_counts_without_taking(side: Side, queue: Queue) -> None:
    queue.send_message("p1")
    [peeked] = queue.peek_messages(max_messages=32)
    assert (peeked.content, peeked.dequeue_count, peeked.pop_receipt) == ("p1", 0, None)
    list(queue.receive_messages(max_messages=1, visibility_timeout=1))
    assert queue.peek_messages(max_messages=32) == []
    side.wait(1.5)
    assert [m.dequeue_count for m in queue.peek_messages(max_messages=32)] == [1]


def test_receive_takes_at_most_max_messages(queue: Queue) -> None:
    for i in range(5):
        queue.send_message(f"r{i}")
    taken = list(queue.receive_messages(max_messages=3, visibility_timeout=30))
    assert [m.content for m in taken] == ["r0", "r1", "r2"] and {m.dequeue_count for m in taken} == {1}
    assert len(list(queue.receive_messages(visibility_timeout=30))) == 2, "no max: until the queue is empty"


def test_a_delayed_message_becomes_visible_after_its_delay(side: Side, queue: Queue) -> None:
    sent = queue.send_message("later", visibility_timeout=1, time_to_live=NEVER_EXPIRE)
    assert sent.content == "later" and sent.id and sent.pop_receipt
    assert isinstance(sent.expires_on, datetime) and sent.expires_on.year == 9999, "never expires"
    assert queue.peek_messages(max_messages=32) == []
    assert queue.depth() == 1
    side.wait(1.5)
    assert [m.content for m in queue.peek_messages(max_messages=32)] == ["later"]
    with pytest.raises(StorageError) as refused:  # a delay must end before the message does
        queue.send_message("x", visibility_timeout=5, time_to_live=5)
    assert refused.value.status_code == 400
    short = queue.send_message("short", time_to_live=1)
    side.wait(1.5)
    assert [m.content for m in queue.peek_messages(max_messages=32)] == ["later"], (short.id, "expired")


def test_the_base64_queue_and_the_raw_queue_agree(side: Side, queue: Queue) -> None:
    """`Account.queue` sends base64 text (as the Functions host reads it): the raw queue receives
    that text, and `decode_message` gives the body back byte for byte."""
    body = json.dumps({"id": "é1", "kind": "noop"}, ensure_ascii=False)
    encoded = side.account.queue(queue.name)
    sent = encoded.send_message(body)
    assert sent.content == body, "what it was given"
    [msg] = list(queue.receive_messages(max_messages=1))
    assert msg.content == base64.b64encode(body.encode("utf-8")).decode("ascii")
    assert decode_message(msg.content.encode("ascii")) == body.encode("utf-8")
    with pytest.raises(TypeError):
        encoded.send_message(b"bytes")  # text only


def test_a_message_holds_64_kib(queue: Queue) -> None:
    queue.send_message("x" * (64 * 1024))
    with pytest.raises(StorageError) as refused:
        queue.send_message("x" * (64 * 1024 + 1))
    assert refused.value.status_code == 413 and not is_throttled(refused.value)


def test_missing_queues(side: Side) -> None:
    missing = side.account.raw_queue(unique("noqueue"))
    for call in (lambda: missing.send_message("x"), missing.depth, lambda: missing.peek_messages()):
        with pytest.raises(NotFound) as gone:
            call()
        assert (gone.value.status_code, gone.value.error_code) == (404, "QueueNotFound")
