"""The `Queue` port on an SDK queue client: its calls, SDK errors translated."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from azure.storage.queue import QueueClient

from shared.storage.failures import AlreadyExists, translated


class AzureQueue:
    """One queue; `client` encodes (base64) or not, as the account built it."""

    def __init__(self, client: QueueClient) -> None:
        self.client = client

    @property
    def name(self) -> str:
        return str(self.client.queue_name)

    def send_message(
        self, content: Any, *, visibility_timeout: int | None = None, time_to_live: int | None = None
    ) -> Any:
        with translated(f"sending to queue {self.name}"):
            return self.client.send_message(
                content, visibility_timeout=visibility_timeout, time_to_live=time_to_live
            )

    def peek_messages(self, max_messages: int | None = None) -> list[Any]:
        with translated(f"peeking at queue {self.name}"):
            return list(self.client.peek_messages(max_messages=max_messages))

    def receive_messages(
        self, *, max_messages: int | None = None, visibility_timeout: int | None = None
    ) -> Iterator[Any]:
        """Messages taken lazily, as the SDK's pager takes them."""
        with translated(f"receiving from queue {self.name}"):
            yield from self.client.receive_messages(
                max_messages=max_messages, visibility_timeout=visibility_timeout
            )

    def delete_message(self, message: Any, pop_receipt: str | None = None) -> None:
        with translated(f"deleting a message of queue {self.name}"):
            self.client.delete_message(message, pop_receipt)

    def update_message(
        self,
        message: Any,
        pop_receipt: str | None = None,
        content: Any = None,
        *,
        visibility_timeout: int = 0,
    ) -> str:
        with translated(f"updating a message of queue {self.name}"):
            updated = self.client.update_message(
                message, pop_receipt, content, visibility_timeout=visibility_timeout
            )
            return str(updated.pop_receipt)

    def depth(self) -> int:
        with translated(f"depth of queue {self.name}"):
            return int(self.client.get_queue_properties().approximate_message_count or 0)

    def create(self) -> None:
        with contextlib.suppress(AlreadyExists), translated(f"creating queue {self.name}"):
            self.client.create_queue()
