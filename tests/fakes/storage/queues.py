"""Queues in memory: what azure-storage-queue's clients do for the app, through the SDK's own
message encoding and pager."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from azure.core.exceptions import ResourceExistsError
from azure.core.paging import ItemPaged
from azure.storage.queue import QueueMessage, QueueProperties, StorageErrorCode
from azure.storage.queue._message_encoding import (
    MessageDecodePolicy,
    MessageEncodePolicy,
    NoDecodePolicy,
    NoEncodePolicy,
)
from azure.storage.queue._models import MessagesPaged

from shared.storage.memory_queues import StoredMessage  # one stored message, as the in-memory port keeps it
from tests.fakes.storage.common import (
    DEFAULT_TTL_S,
    MAX_MESSAGE_BYTES,
    MAX_VISIBILITY_S,
    NEVER,
    ErrorResponse,
    check_name,
    queue_error,
    raw_error,
    refuse_unknown,
    whole_seconds,
)

if TYPE_CHECKING:
    from tests.fakes.storage.account import MemoryStorage


@dataclass
class QueueRecord:
    name: str
    metadata: dict[str, str]
    messages: dict[str, StoredMessage] = field(default_factory=dict)

    def live(self, now: datetime) -> list[StoredMessage]:
        """Messages not expired (expired ones are dropped), oldest first."""
        for gone in [m.id for m in self.messages.values() if m.expires_on <= now]:
            del self.messages[gone]
        return sorted(self.messages.values(), key=lambda m: m.seq)


# -- queues -------------------------------------------------------------------------------------


@dataclass
class _PeekedItem:
    """A message as the SDK's generated layer gives it (what `QueueMessage._from_generated` and the
    decode policies read)."""

    message_id: str
    insertion_time: datetime
    expiration_time: datetime
    dequeue_count: int
    message_text: str


@dataclass
class _ReceivedItem(_PeekedItem):
    pop_receipt: str
    time_next_visible: datetime


@dataclass
class _Batch:
    items_property: list[_ReceivedItem]


class MemoryQueueClient:
    """One queue of a `MemoryStorage` (azure-storage-queue's `QueueClient`, as the app uses it),
    with the SDK's encode and decode policies."""

    def __init__(
        self,
        account: MemoryStorage,
        name: str,
        encode: MessageEncodePolicy | None = None,
        decode: MessageDecodePolicy | None = None,
    ) -> None:
        self.account = account
        self.queue_name = name
        self.url = account.url(name)
        self._encode = encode or NoEncodePolicy()
        self._decode = decode or NoDecodePolicy()

    def _queue(self) -> QueueRecord:
        found = self.account.queues.get(self.queue_name)
        if found is None:
            raise queue_error(404, "QueueNotFound", "The specified queue does not exist.")
        return found

    def create_queue(self, *, metadata: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "create_queue")
        check_name(self.queue_name, queue_error)
        with self.account.lock:
            self.account.log("PUT", self.queue_name)
            found = self.account.queues.get(self.queue_name)
            if found is None:
                self.account.queues[self.queue_name] = QueueRecord(self.queue_name, dict(metadata or {}))
                return
            if found.metadata != dict(metadata or {}):
                raise queue_error(409, "QueueAlreadyExists", "The specified queue already exists.")
            # 204: the same queue is there; the SDK raises it as ResourceExistsError
            exists = ResourceExistsError(
                message="Queue already exists\nErrorCode:QueueAlreadyExists",
                response=cast(Any, ErrorResponse(204, "QueueAlreadyExists")),
            )
            exists.error_code = StorageErrorCode.queue_already_exists  # type: ignore[attr-defined]
            raise exists

    def send_message(
        self,
        content: Any,
        *,
        visibility_timeout: int | None = None,
        time_to_live: int | None = None,
        **kwargs: Any,
    ) -> QueueMessage:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "send_message")
        self._encode.configure(require_encryption=False, key_encryption_key=None, resolver=None)
        text = self._encode(content)
        delay = int(visibility_timeout or 0)
        ttl = DEFAULT_TTL_S if time_to_live is None else int(time_to_live)
        with self.account.lock:
            self.account.log("POST", f"{self.queue_name}/messages")
            queue = self._queue()
            if not 0 <= delay <= MAX_VISIBILITY_S or ttl == 0 or ttl < -1:
                raise queue_error(
                    400,
                    "OutOfRangeQueryParameterValue",
                    "One of the query parameters specified in the request URI is outside the permissible range.",
                )
            if ttl != -1 and delay >= ttl:
                raise queue_error(
                    400,
                    "InvalidQueryParameterValue",
                    "Value for one of the query parameters specified in the request URI is invalid.",
                )
            if len(text.encode("utf-8")) > MAX_MESSAGE_BYTES:
                raise queue_error(
                    413,
                    "RequestBodyTooLarge",
                    "The request body is too large and exceeds the maximum permissible limit.",
                )
            now = self.account.clock()
            msg = StoredMessage(
                id=str(uuid.uuid4()),
                text=text,
                seq=self.account.next_seq(),
                inserted_on=now,
                expires_on=NEVER if ttl == -1 else now + timedelta(seconds=ttl),
                visible_at=now + timedelta(seconds=delay),
                pop_receipt=uuid.uuid4().hex,
            )
            queue.messages[msg.id] = msg
            return QueueMessage(
                content=content,
                id=msg.id,
                inserted_on=whole_seconds(msg.inserted_on),
                expires_on=whole_seconds(msg.expires_on),
                pop_receipt=msg.pop_receipt,
                next_visible_on=whole_seconds(msg.visible_at),
            )

    def _receive(self, number_of_messages: int | None = None, *, visibility_timeout: int | None) -> _Batch:
        """One Get Messages request (the SDK's pager calls it once a page, and processes its errors)."""
        count = 1 if number_of_messages is None else number_of_messages
        lease = 30 if visibility_timeout is None else visibility_timeout
        with self.account.lock:
            self.account.log("GET", f"{self.queue_name}/messages")
            if self.queue_name not in self.account.queues:
                raise raw_error(404, "QueueNotFound", "The specified queue does not exist.")
            if not 1 <= count <= 32 or not 1 <= lease <= MAX_VISIBILITY_S:
                raise raw_error(
                    400,
                    "OutOfRangeQueryParameterValue",
                    "One of the query parameters specified in the request URI is outside the permissible range.",
                )
            now = self.account.clock()
            taken = [m for m in self.account.queues[self.queue_name].live(now) if m.visible_at <= now][:count]
            items = []
            for msg in taken:
                msg.dequeue_count += 1
                msg.pop_receipt = uuid.uuid4().hex
                msg.visible_at = now + timedelta(seconds=lease)
                items.append(
                    _ReceivedItem(
                        msg.id,
                        whole_seconds(msg.inserted_on),
                        whole_seconds(msg.expires_on),
                        msg.dequeue_count,
                        msg.text,
                        msg.pop_receipt,
                        whole_seconds(msg.visible_at),
                    )
                )
        self._decode.configure(require_encryption=False, key_encryption_key=None, resolver=None)
        self._decode(cast(Any, None), items, {})
        return _Batch(items)

    def receive_messages(
        self,
        *,
        messages_per_page: int | None = None,
        visibility_timeout: int | None = None,
        max_messages: int | None = None,
        **kwargs: Any,
    ) -> ItemPaged[QueueMessage]:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "receive_messages")
        if max_messages is not None and messages_per_page is not None and max_messages < messages_per_page:
            raise ValueError("max_messages must be greater or equal to messages_per_page")
        command = functools.partial(self._receive, visibility_timeout=visibility_timeout)
        return ItemPaged(
            command,
            results_per_page=messages_per_page,
            page_iterator_class=MessagesPaged,
            max_messages=max_messages,
        )

    def peek_messages(self, max_messages: int | None = None, **kwargs: Any) -> list[QueueMessage]:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "peek_messages")
        if max_messages and not 1 <= max_messages <= 32:
            raise ValueError("Number of messages to peek should be between 1 and 32")
        with self.account.lock:
            self.account.log("GET", f"{self.queue_name}/messages")
            now = self.account.clock()
            visible = [m for m in self._queue().live(now) if m.visible_at <= now][: max_messages or 1]
            items = [
                _PeekedItem(
                    m.id, whole_seconds(m.inserted_on), whole_seconds(m.expires_on), m.dequeue_count, m.text
                )
                for m in visible
            ]
        self._decode.configure(require_encryption=False, key_encryption_key=None, resolver=None)
        self._decode(cast(Any, None), items, {})
        return [QueueMessage._from_generated(item) for item in items]

    def delete_message(self, message: Any, pop_receipt: str | None = None, **kwargs: Any) -> None:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "delete_message")
        try:
            message_id = message.id
            receipt = pop_receipt or message.pop_receipt
        except AttributeError:
            message_id, receipt = message, pop_receipt
        if receipt is None:
            raise ValueError("pop_receipt must be present")
        with self.account.lock:
            self.account.log("DELETE", f"{self.queue_name}/messages/{message_id}")
            queue = self._queue()
            live = {m.id: m for m in queue.live(self.account.clock())}
            found = live.get(message_id)
            if found is None:
                raise queue_error(404, "MessageNotFound", "The specified message does not exist.")
            if found.pop_receipt != receipt:
                raise queue_error(
                    400,
                    "PopReceiptMismatch",
                    "The specified pop receipt did not match the pop receipt for a dequeued message.",
                )
            del queue.messages[message_id]

    def update_message(
        self,
        message: Any,
        pop_receipt: str | None = None,
        content: Any = None,
        *,
        visibility_timeout: int | None = None,
        **kwargs: Any,
    ) -> QueueMessage:
        """UpdateMessage: visible `visibility_timeout` seconds from now (content replaced when
        given); a new pop receipt. 404 MessageNotFound / 400 PopReceiptMismatch as Azure answers."""
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "update_message")
        try:
            message_id = message.id
            receipt = pop_receipt or message.pop_receipt
        except AttributeError:
            message_id, receipt = message, pop_receipt
        if receipt is None or visibility_timeout is None:
            raise ValueError("pop_receipt and visibility_timeout must be present")
        text = None
        if content is not None:
            self._encode.configure(require_encryption=False, key_encryption_key=None, resolver=None)
            text = self._encode(content)
        with self.account.lock:
            self.account.log("PUT", f"{self.queue_name}/messages/{message_id}")
            queue = self._queue()
            if not 0 <= int(visibility_timeout) <= MAX_VISIBILITY_S:
                raise queue_error(
                    400,
                    "OutOfRangeQueryParameterValue",
                    "One of the query parameters specified in the request URI is outside the permissible range.",
                )
            found = {m.id: m for m in queue.live(self.account.clock())}.get(message_id)
            if found is None:
                raise queue_error(404, "MessageNotFound", "The specified message does not exist.")
            if found.pop_receipt != receipt:
                raise queue_error(
                    400,
                    "PopReceiptMismatch",
                    "The specified pop receipt did not match the pop receipt for a dequeued message.",
                )
            if text is not None:
                found.text = text
            found.pop_receipt = uuid.uuid4().hex
            found.visible_at = self.account.clock() + timedelta(seconds=int(visibility_timeout))
            return QueueMessage(
                content=content,
                id=found.id,
                pop_receipt=found.pop_receipt,
                next_visible_on=whole_seconds(found.visible_at),
            )

    def get_queue_properties(self, **kwargs: Any) -> QueueProperties:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "get_queue_properties")
        with self.account.lock:
            self.account.log("GET", self.queue_name)
            queue = self._queue()
            props = QueueProperties()
            props.name = self.queue_name
            props.metadata = dict(queue.metadata)
            props.approximate_message_count = len(queue.live(self.account.clock()))
            return props


class MemoryQueueService:
    """The Queue service of a `MemoryStorage` (azure-storage-queue's `QueueServiceClient`, as used)."""

    def __init__(self, account: MemoryStorage) -> None:
        self.account = account
        self.url = account.url()

    def get_queue_client(
        self,
        queue: str,
        *,
        message_encode_policy: MessageEncodePolicy | None = None,
        message_decode_policy: MessageDecodePolicy | None = None,
    ) -> MemoryQueueClient:
        return MemoryQueueClient(self.account, queue, message_encode_policy, message_decode_policy)
