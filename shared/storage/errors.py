"""The storage-error boundary: codes and statuses of SDK errors, and which are worth retrying.

Imports only azure-core, so pure layers (the ledger, documents) can name storage failures without
loading the storage SDK.
"""

from __future__ import annotations

from enum import Enum

from azure.core.exceptions import AzureError, HttpResponseError, ServiceRequestError, ServiceResponseError

from shared.core.errors import StorageThrottled

# Errors a delete/update of a queue message may meet when another consumer took the message.
GONE_MESSAGE_CODES = frozenset(
    {"PopReceiptMismatch", "MessageNotFound", "QueueNotFound", "QueueBeingDeleted"}
)


def error_code(exc: BaseException) -> str | None:
    """The storage error code of an SDK exception (e.g. 'BlobAlreadyExists'), if any.

    The storage SDKs set `error_code` to their `StorageErrorCode` enum for the codes they know,
    whose `str()` is 'StorageErrorCode.CONDITION_NOT_MET': its value is the service's code."""
    code = getattr(exc, "error_code", None)
    if isinstance(code, Enum):
        code = code.value
    if code:
        return str(code)
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    value = headers.get("x-ms-error-code")
    return str(value) if value else None


def status_code(exc: BaseException) -> int | None:
    value = getattr(exc, "status_code", None)
    return int(value) if isinstance(value, int) else None


def is_throttled(exc: BaseException) -> bool:
    """True for server-busy / 5xx / connection failures: worth retrying later."""
    if isinstance(exc, ServiceRequestError | ServiceResponseError):
        return True
    status = status_code(exc)
    return isinstance(exc, HttpResponseError) and status is not None and (status == 429 or status >= 500)


def storage_failure(exc: AzureError, action: str, name: str) -> Exception:
    """StorageThrottled for what may pass (5xx, 429, timeouts, connection errors); else `exc`."""
    if is_throttled(exc):
        status = getattr(exc, "status_code", None) or exc.__class__.__name__
        return StorageThrottled(f"{action} of {name} failed: storage busy ({status})")
    return exc
