"""The storage-error boundary: SDK errors become this package's own exceptions here, nowhere else.

The ports' Azure adapters wrap their SDK calls in `with translated("what"):`, so code outside
`shared.storage` calls the ports unwrapped and catches `StorageError` and its subclasses
(`NotFound`, `AlreadyExists`, `ConditionFailed`, `StorageBusy`); a lint-imports contract keeps
`azure.core.exceptions` out of every other module of `shared`. Imports only azure-core, so it loads
no storage SDK.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum

from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)

from shared.core.errors import StorageThrottled


class StorageError(Exception):
    """A storage call failed (an SDK error, translated); `status_code` and `error_code` as the
    service answered them, when it did."""

    def __init__(
        self,
        message: str,
        status_code: int | None = None,
        error_code: str | None = None,
        answered: bool = True,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error_code = error_code
        self.answered = answered
        """False when no answer came (a connection refused or dropped, a timeout)."""


class NotFound(StorageError):
    """The blob, entity, queue, table or container does not exist (404)."""


class AlreadyExists(StorageError):
    """A create found the resource already there (409)."""


class ConditionFailed(StorageError):
    """A conditional write lost: the resource changed since it was read (412 / ETag mismatch)."""


class StorageBusy(StorageError, StorageThrottled):
    """Server busy, 5xx, 429, a timeout or a dropped connection: worth retrying later. Also a
    `StorageThrottled`, so the job is retried with backoff."""


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
    if isinstance(exc, ServiceRequestError | ServiceResponseError | StorageBusy):
        return True
    status = status_code(exc)
    return isinstance(exc, HttpResponseError) and status is not None and (status == 429 or status >= 500)


def storage_failure(exc: AzureError, action: str, name: str) -> Exception:
    """A document store's failure: StorageThrottled for what may pass (5xx, 429, timeouts,
    connection errors); else this package's exception for it (`translate`)."""
    if is_throttled(exc):
        status = getattr(exc, "status_code", None) or exc.__class__.__name__
        return StorageThrottled(f"{action} of {name} failed: storage busy ({status})")
    return translate(exc, f"{action} of {name}")


def translate(exc: AzureError, what: str) -> StorageError:
    """The exception of this package for an SDK error met while doing `what`."""
    status = status_code(exc)
    code = error_code(exc)
    answered = isinstance(exc, HttpResponseError)
    kind: type[StorageError]
    if isinstance(exc, ResourceNotFoundError):
        kind = NotFound
    elif isinstance(exc, ResourceExistsError):
        kind = AlreadyExists
    elif isinstance(exc, ResourceModifiedError):
        kind = ConditionFailed
    elif is_throttled(exc):
        return StorageBusy(
            f"{what}: storage busy ({status or exc.__class__.__name__})", status, code, answered
        )
    else:
        kind = StorageError
    return kind(f"{what}: {code or status or exc.__class__.__name__}: {exc.message}", status, code, answered)


def failure_name(exc: BaseException) -> str:
    """The class name of a storage failure for logs and answers: the SDK error's when translated
    (e.g. 'ServiceRequestError'), else the exception's own."""
    if isinstance(exc, StorageError) and isinstance(exc.__cause__, AzureError):
        return exc.__cause__.__class__.__name__
    return exc.__class__.__name__


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Run a block of storage calls; an SDK error raised in it leaves as `translate(exc, what)`
    (with the SDK error as its cause). Anything else passes unchanged."""
    try:
        yield
    except AzureError as exc:
        raise translate(exc, what) from exc
