"""The storage SDK's behaviour the Azure adapters rely on, asserted the same way on the SDK-imitating
fake (`tests.fakes.storage`, in `make test-fast`) and on Azurite (in `make test`): the fake the
adapters' fast-tier tests run on (test_port_contract.py `[sdk]`) cannot drift from the service
without one of these failing on one side. Tables are
the `Tables` port's, held the same way by tests/integration/test_table_port.py.

Time: the in-memory variant moves a manual clock; the Azurite one sleeps (1-second timeouts).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import BlobBlock, ContainerClient, ContentSettings

from shared.config.settings import Settings
from shared.core.documents import DocumentChanged, DocumentExists, TagQuery
from shared.core.envelope import decode_message
from shared.core.messages import NEVER_EXPIRE
from shared.storage.blob_documents import BlobDocuments
from shared.storage.clients import StorageClients, clients_for
from shared.storage.failures import GONE_MESSAGE_CODES, error_code, is_throttled, status_code
from shared.storage.limits import read_capped, total_size
from shared.storage.memory_account import ManualClock, real_time
from tests.fakes.storage import MemoryStorage
from tests.integration.helpers import unique
from tests.storage_params import STORAGE_BACKENDS


@dataclass
class Sdk:
    """The SDK's clients on one account under test, and how to let its time pass."""

    clients: StorageClients
    wait: Callable[[float], None]


@pytest.fixture(params=STORAGE_BACKENDS)
def account(request: pytest.FixtureRequest) -> Sdk:
    if request.param == "azurite":
        azurite = request.getfixturevalue("azurite")
        settings = Settings.from_env({"AzureWebJobsStorage": azurite.connection_string})
        return Sdk(clients_for(settings.storage), time.sleep)
    clock = ManualClock(real_time())
    return Sdk(MemoryStorage(clock).clients(), clock.advance)


@pytest.fixture
def container(account: Sdk) -> ContainerClient:
    name = unique("contract")
    container = account.clients.container(name)
    container.create_container()
    return container


@pytest.fixture
def queue_name(account: Sdk) -> str:
    name = unique("contract")
    account.clients.raw_queue(name).create_queue()
    return name


def raised(exc: BaseException) -> tuple[str, int | None, str]:
    """An SDK error as the app sees it: its class, status and error code (`error_code`: the
    service's code, whether the SDK gave it as a string or as its enum)."""
    return type(exc).__name__, status_code(exc), error_code(exc) or ""


# -- blobs ------------------------------------------------------------------------------------


def test_create_if_absent_refuses_an_existing_blob(container: ContainerClient) -> None:
    blob = container.get_blob_client("a.json")
    first = blob.upload_blob(b"1", match_condition=MatchConditions.IfMissing)
    assert first["etag"]
    with pytest.raises(ResourceExistsError) as refused:
        blob.upload_blob(b"2", match_condition=MatchConditions.IfMissing)
    assert raised(refused.value) == ("ResourceExistsError", 409, "BlobAlreadyExists")
    with pytest.raises(ResourceExistsError) as refused:
        blob.upload_blob(b"2")  # overwrite=False sends If-None-Match: * too
    assert raised(refused.value) == ("ResourceExistsError", 409, "BlobAlreadyExists")
    assert container.download_blob("a.json").readall() == b"1"


def test_a_write_on_a_stale_etag_is_refused_with_412(container: ContainerClient) -> None:
    blob = container.get_blob_client("b.json")
    old = blob.upload_blob(b"1")["etag"]
    new = blob.upload_blob(b"2", overwrite=True, etag=old, match_condition=MatchConditions.IfNotModified)[
        "etag"
    ]
    assert new != old
    with pytest.raises(ResourceModifiedError) as refused:
        blob.upload_blob(b"3", overwrite=True, etag=old, match_condition=MatchConditions.IfNotModified)
    assert raised(refused.value) == ("ResourceModifiedError", 412, "ConditionNotMet")
    assert refused.value.error_code == "ConditionNotMet"  # type: ignore[attr-defined]
    container.delete_blob("b.json")
    with pytest.raises(ResourceModifiedError):  # the blob is gone: its ETag cannot match
        blob.upload_blob(b"4", overwrite=True, etag=new, match_condition=MatchConditions.IfNotModified)


def test_the_document_store_answers_conflicts_the_same_way(container: ContainerClient) -> None:
    docs = BlobDocuments(container, tags=lambda d: {"state": str(d["s"])})
    made = docs.create("x.json", {"s": "a"})
    with pytest.raises(DocumentExists):
        docs.create("x.json", {"s": "b"})
    changed = docs.replace("x.json", made, {"s": "b"})
    with pytest.raises(DocumentChanged):
        docs.replace("x.json", made, {"s": "c"})
    read = docs.read("x.json")
    assert read is not None and read.data == {"s": "b"} and read.etag == changed.etag
    assert list(docs.find(TagQuery("state", "=", "b"))) == ["x.json"]
    docs.delete("x.json")
    docs.delete("x.json")  # a missing document is not an error
    assert docs.read("x.json") is None
    with pytest.raises(DocumentChanged):
        docs.replace("x.json", changed, {"s": "d"})


def test_missing_blobs_and_containers(account: Sdk, container: ContainerClient) -> None:
    with pytest.raises(ResourceNotFoundError) as missing:
        container.download_blob("none.json")
    assert raised(missing.value) == ("ResourceNotFoundError", 404, "BlobNotFound")
    with pytest.raises(ResourceNotFoundError) as missing:
        container.delete_blob("none.json")
    assert raised(missing.value) == ("ResourceNotFoundError", 404, "BlobNotFound")
    assert container.get_blob_client("none.json").exists() is False
    with pytest.raises(ResourceNotFoundError) as missing:
        account.clients.container(unique("nocontainer")).upload_blob("a", b"1")
    assert raised(missing.value) == ("ResourceNotFoundError", 404, "ContainerNotFound")
    with pytest.raises(ResourceExistsError) as exists:
        account.clients.container(container.container_name).create_container()
    assert raised(exists.value) == ("ResourceExistsError", 409, "ContainerAlreadyExists")


def test_metadata_and_tags_are_replaced_by_every_write(container: ContainerClient) -> None:
    container.upload_blob("t.json", b"1", metadata={"status": "queued"}, tags={"state": "done"})
    listed = {b.name: b.metadata for b in container.list_blobs(include=["metadata"])}
    assert listed == {"t.json": {"status": "queued"}}
    found = list(container.find_blobs_by_tags("\"state\" = 'done'"))
    assert [(b.name, b.tags) for b in found] == [("t.json", {"state": "done"})]
    container.upload_blob("t.json", b"2", overwrite=True)  # none given: both cleared
    assert [b.metadata for b in container.list_blobs(include=["metadata"])] == [{}]
    assert list(container.find_blobs_by_tags("\"state\" = 'done'")) == []


def test_find_by_tags_compares_strings_in_order(container: ContainerClient) -> None:
    for name, lease in (("a", "2026-01-01T00:00:01Z"), ("b", "2026-01-01T00:00:03Z"), ("c", "2026-01-01")):
        container.upload_blob(name, b"", tags={"lease": lease})
    container.upload_blob("untagged", b"")
    ended = [b.name for b in container.find_blobs_by_tags("\"lease\" < '2026-01-01T00:00:02Z'")]
    assert sorted(ended) == ["a", "c"]


def test_listing_by_prefix_in_pages_in_name_order(container: ContainerClient) -> None:
    for name in ("jobs/b", "jobs/a", "unparsed/x", "jobs/c"):
        container.upload_blob(name, b"{}")
    pages = [
        [b.name for b in page]
        for page in container.list_blobs(name_starts_with="jobs/", results_per_page=2).by_page()
    ]
    assert pages == [["jobs/a", "jobs/b"], ["jobs/c"]]
    assert all(b.last_modified is not None for b in container.list_blobs())


def test_ranged_reads_give_the_full_size_and_an_empty_blob_416(container: ContainerClient) -> None:
    container.upload_blob("ten", b"0123456789")
    part = container.download_blob("ten", offset=0, length=4, max_concurrency=1)
    assert part.readall() == b"0123" and total_size(part.properties.content_range, part.size) == 10
    whole = container.download_blob("ten", offset=0, length=100, max_concurrency=1)
    assert whole.readall() == b"0123456789" and total_size(whole.properties.content_range, 0) == 10
    container.upload_blob("empty", b"")
    with pytest.raises(HttpResponseError) as refused:
        container.download_blob("empty", offset=0, length=10, max_concurrency=1)
    assert status_code(refused.value) == 416
    assert read_capped(container.get_blob_client("empty"), 10) == b""  # the app's reader takes it
    assert container.download_blob("empty").readall() == b""  # no range asked: the SDK reads it whole


def test_staged_blocks_become_the_blob_only_when_committed(container: ContainerClient) -> None:
    blob = container.get_blob_client("staged")
    ids = [base64.b64encode(f"block-{i:08d}".encode()).decode() for i in range(3)]
    for i, part in enumerate((b"abc", b"def", b"gh")):
        blob.stage_block(ids[i], part, length=len(part))
    assert not blob.exists()  # staged, not committed: no blob yet
    committed, uncommitted = blob.get_block_list("all")
    assert committed == [] and sorted((b.id, b.size) for b in uncommitted) == sorted(
        zip(ids, (3, 3, 2), strict=True)
    )
    blob.commit_block_list([BlobBlock(block_id=i) for i in ids], content_settings=ContentSettings("text/csv"))
    assert blob.download_blob().readall() == b"abcdefgh"
    assert blob.download_blob().properties.content_settings.content_type == "text/csv"
    # a second write of the same name: blocks staged again (one of them left over), a shorter list
    blob.stage_block(ids[0], b"XY", length=2)
    blob.stage_block(ids[1], b"Z", length=1)
    blob.stage_block(ids[2], b"left over", length=9)
    assert blob.download_blob().readall() == b"abcdefgh"  # still the committed blob
    blob.commit_block_list([BlobBlock(block_id=ids[0]), BlobBlock(block_id=ids[1])])
    assert blob.download_blob().readall() == b"XYZ"  # replaced whole
    committed, uncommitted = blob.get_block_list("all")
    assert [(b.id, b.size) for b in committed] == [(ids[0], 2), (ids[1], 1)] and uncommitted == []
    with pytest.raises(HttpResponseError) as refused:
        blob.commit_block_list([BlobBlock(block_id=base64.b64encode(b"block-00000009").decode())])
    assert raised(refused.value)[1:] == (400, "InvalidBlockList")
    assert blob.download_blob().readall() == b"XYZ"


def test_delete_if_unmodified_since(account: Sdk, container: ContainerClient) -> None:
    container.upload_blob("old", b"")
    written = next(iter(container.list_blobs())).last_modified
    with pytest.raises(ResourceModifiedError) as refused:
        container.delete_blob("old", if_unmodified_since=written - timedelta(seconds=5))
    assert raised(refused.value) == ("ResourceModifiedError", 412, "ConditionNotMet")
    container.delete_blob("old", if_unmodified_since=written + timedelta(seconds=5))
    assert [b.name for b in container.list_blobs()] == []


# -- queues -----------------------------------------------------------------------------------


def test_a_message_not_deleted_comes_back_after_its_visibility_timeout(account: Sdk, queue_name: str) -> None:
    queue = account.clients.raw_queue(queue_name)
    queue.send_message("m1")
    [first] = list(queue.receive_messages(max_messages=32, visibility_timeout=1))
    assert first.content == "m1" and first.dequeue_count == 1 and first.pop_receipt
    assert list(queue.receive_messages(max_messages=32, visibility_timeout=1)) == [], "invisible while leased"
    assert queue.get_queue_properties().approximate_message_count == 1, "counted while invisible"
    account.wait(1.5)
    [again] = list(queue.receive_messages(max_messages=32, visibility_timeout=30))
    assert (again.id, again.content, again.dequeue_count) == (first.id, "m1", 2)
    assert again.pop_receipt != first.pop_receipt
    with pytest.raises(HttpResponseError) as stale:
        queue.delete_message(first)  # the first receipt is spent
    assert raised(stale.value) == ("HttpResponseError", 400, "PopReceiptMismatch")
    assert stale.value.error_code in GONE_MESSAGE_CODES  # type: ignore[attr-defined]
    queue.delete_message(again)
    with pytest.raises(ResourceNotFoundError) as gone:
        queue.delete_message(again)
    assert raised(gone.value) == ("ResourceNotFoundError", 404, "MessageNotFound")
    assert queue.get_queue_properties().approximate_message_count == 0


def test_peek_shows_dequeue_counts_without_taking(account: Sdk, queue_name: str) -> None:
    queue = account.clients.raw_queue(queue_name)
    queue.send_message("p1")
    [peeked] = queue.peek_messages(max_messages=32)
    assert (peeked.content, peeked.dequeue_count, peeked.pop_receipt) == ("p1", 0, None)
    list(queue.receive_messages(max_messages=1, visibility_timeout=1))
    assert queue.peek_messages(max_messages=32) == []
    account.wait(1.5)
    assert [m.dequeue_count for m in queue.peek_messages(max_messages=32)] == [1]


def test_receive_takes_at_most_max_messages(account: Sdk, queue_name: str) -> None:
    queue = account.clients.raw_queue(queue_name)
    for i in range(5):
        queue.send_message(f"r{i}")
    taken = list(queue.receive_messages(max_messages=3, visibility_timeout=30))
    assert len(taken) == 3 and {m.dequeue_count for m in taken} == {1}
    assert len(list(queue.receive_messages(visibility_timeout=30))) == 2, "no max: until the queue is empty"


def test_a_delayed_message_becomes_visible_after_its_delay(account: Sdk, queue_name: str) -> None:
    queue = account.clients.raw_queue(queue_name)
    sent = queue.send_message("later", visibility_timeout=1, time_to_live=NEVER_EXPIRE)
    assert sent.expires_on is not None and sent.expires_on.year == 9999, "never expires"
    assert queue.peek_messages(max_messages=32) == []
    assert queue.get_queue_properties().approximate_message_count == 1
    account.wait(1.5)
    assert [m.content for m in queue.peek_messages(max_messages=32)] == ["later"]
    with pytest.raises(HttpResponseError) as refused:  # a delay must end before the message does
        queue.send_message("x", visibility_timeout=5, time_to_live=5)
    assert status_code(refused.value) == 400


def test_a_message_expires_after_its_time_to_live(account: Sdk, queue_name: str) -> None:
    queue = account.clients.raw_queue(queue_name)
    queue.send_message("short", time_to_live=1)
    account.wait(1.5)
    assert queue.peek_messages(max_messages=32) == []
    assert queue.get_queue_properties().approximate_message_count == 0


def test_the_base64_client_and_the_raw_client_agree(account: Sdk, queue_name: str) -> None:
    """`StorageClients.queue` sends base64 text (the SDK's TextBase64EncodePolicy): the raw client
    receives that text, and `decode_message` gives the body back byte for byte."""
    body = json.dumps({"id": "é1", "kind": "noop"}, ensure_ascii=False)
    sent = account.clients.queue(queue_name).send_message(body)
    assert sent.content == body, "the SDK hands back what it was given"
    [msg] = list(account.clients.raw_queue(queue_name).receive_messages(max_messages=1))
    assert msg.content == base64.b64encode(body.encode("utf-8")).decode("ascii")
    assert decode_message(msg.content.encode("ascii")) == body.encode("utf-8")
    with pytest.raises(TypeError):
        account.clients.queue(queue_name).send_message(b"bytes")  # the policy takes text only


def test_a_message_holds_64_kib(account: Sdk, queue_name: str) -> None:
    queue = account.clients.raw_queue(queue_name)
    queue.send_message("x" * (64 * 1024))
    with pytest.raises(HttpResponseError) as refused:
        queue.send_message("x" * (64 * 1024 + 1))
    assert status_code(refused.value) == 413 and not is_throttled(refused.value)


def test_missing_and_existing_queues(account: Sdk, queue_name: str) -> None:
    missing = account.clients.raw_queue(unique("noqueue"))
    for call in (lambda: missing.send_message("x"), missing.get_queue_properties):
        with pytest.raises(ResourceNotFoundError) as gone:
            call()
        assert raised(gone.value)[::2] == ("ResourceNotFoundError", "QueueNotFound")
    with pytest.raises(ResourceExistsError):  # the app suppresses it at start-up
        account.clients.raw_queue(queue_name).create_queue()
