"""Queue storage operations with the real host's error handling (by status AND error code)."""

from __future__ import annotations

import contextlib
import logging
import math

from azure.core.exceptions import HttpResponseError, ResourceExistsError
from azure.storage.queue import QueueClient, QueueMessage

from devhost.decisions import is_ignorable_completion_error

log = logging.getLogger("devhost.queue")


def error_info(exc: BaseException) -> tuple[int | None, str | None]:
    """(HTTP status, storage error code) of an SDK error; (None, None) when there was no response."""
    if isinstance(exc, HttpResponseError):
        code = getattr(exc, "error_code", None)  # set by the storage SDK
        code_text = str(getattr(code, "value", code)) if code else None
        return exc.status_code, code_text
    return None, None


def seconds(value: float) -> int:
    """Queue visibility values are whole seconds."""
    return max(0, math.ceil(value))


def receive_batch(queue: QueueClient, count: int, lease: float) -> list[QueueMessage]:
    """One GetMessages call: up to `count` messages, invisible for `lease` seconds."""
    pages = queue.receive_messages(
        messages_per_page=count, max_messages=count, visibility_timeout=seconds(lease)
    ).by_page()
    try:
        return list(next(pages))
    except StopIteration:
        return []


def delete_message(queue: QueueClient, message_id: str, pop_receipt: str) -> bool:
    """DeleteMessage; True if deleted, False if ignored (PopReceiptMismatch, MessageNotFound,
    QueueNotFound, QueueBeingDeleted/Disabled). Any other error is raised."""
    try:
        queue.delete_message(message_id, pop_receipt)
        return True
    except HttpResponseError as exc:
        status, code = error_info(exc)
        if is_ignorable_completion_error(status, code):
            log.info(
                "delete of message %s on queue %s ignored: %s %s (taken by another consumer, or gone)",
                message_id, queue.queue_name, status, code,
            )  # fmt: skip
            return False
        raise


def release_message(queue: QueueClient, message_id: str, pop_receipt: str, visibility: float) -> bool:
    """UpdateMessage(visibility) with content unchanged; True if done, False if ignored (400/404/409
    with the known codes). Any other error is raised."""
    try:
        queue.update_message(message_id, pop_receipt, visibility_timeout=seconds(visibility))
        return True
    except HttpResponseError as exc:
        status, code = error_info(exc)
        if is_ignorable_completion_error(status, code):
            log.info("release of message %s on %s ignored: %s %s", message_id, queue.queue_name, status, code)
            return False
        raise


def renew_message(queue: QueueClient, message_id: str, pop_receipt: str, lease: float) -> str:
    """Extend the lease (content unchanged); returns the new pop receipt. Errors are raised."""
    updated = queue.update_message(message_id, pop_receipt, visibility_timeout=seconds(lease))
    return str(updated.pop_receipt)


def send_create_if_missing(queue: QueueClient, text: str) -> None:
    """AddMessageAndCreateIfNotExists: send; on 404 QueueNotFound create the queue and send again."""
    try:
        queue.send_message(text)
        return
    except HttpResponseError as exc:
        if error_info(exc) != (404, "QueueNotFound"):
            raise
    with contextlib.suppress(ResourceExistsError):
        queue.create_queue()
    queue.send_message(text)
