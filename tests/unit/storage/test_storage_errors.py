"""The storage-error boundary names codes as the service sends them (no I/O)."""

from __future__ import annotations

import pytest
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from azure.storage.blob import StorageErrorCode as BlobCode
from azure.storage.queue import StorageErrorCode as QueueCode

from shared.core.errors import StorageThrottled, TransientError
from shared.storage.failures import (
    GONE_MESSAGE_CODES,
    AlreadyExists,
    ConditionFailed,
    NotFound,
    StorageBusy,
    StorageError,
    error_code,
    failure_name,
    translated,
)


def failure(code: object) -> HttpResponseError:
    exc = HttpResponseError(message="failed")
    exc.error_code = code  # type: ignore[attr-defined]  # what the storage SDKs set
    return exc


def test_an_sdk_enum_code_is_the_services_code() -> None:
    assert error_code(failure(BlobCode.CONDITION_NOT_MET)) == "ConditionNotMet"
    assert error_code(failure(BlobCode.BLOB_ALREADY_EXISTS)) == "BlobAlreadyExists"
    assert error_code(failure(QueueCode.POP_RECEIPT_MISMATCH)) in GONE_MESSAGE_CODES


def test_a_plain_code_and_no_code() -> None:
    assert error_code(failure("SomethingNew")) == "SomethingNew"
    assert error_code(failure(None)) is None
    assert error_code(ValueError("x")) is None


def answered(kind: type[HttpResponseError], status: int, code: str | None = None) -> HttpResponseError:
    exc = kind(message="failed")
    exc.status_code = status
    exc.error_code = code  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (answered(ResourceNotFoundError, 404, "BlobNotFound"), NotFound),
        (answered(ResourceExistsError, 409, "TableAlreadyExists"), AlreadyExists),
        (answered(ResourceModifiedError, 412, "ConditionNotMet"), ConditionFailed),
        (answered(HttpResponseError, 503, "ServerBusy"), StorageBusy),
        (answered(HttpResponseError, 429), StorageBusy),
        (ServiceRequestError("connection refused"), StorageBusy),
        (answered(HttpResponseError, 403, "AuthorizationFailure"), StorageError),
    ],
)
def test_translated_turns_each_sdk_error_into_the_storage_packages_own(
    raised: AzureError, expected: type[StorageError]
) -> None:
    with pytest.raises(StorageError) as caught, translated("reading x"):
        raise raised
    assert type(caught.value) is expected
    assert caught.value.__cause__ is raised
    assert str(caught.value).startswith("reading x: ")
    assert caught.value.status_code == getattr(raised, "status_code", None)
    assert caught.value.error_code == error_code(raised)
    assert caught.value.answered is isinstance(raised, HttpResponseError)
    assert failure_name(caught.value) == type(raised).__name__


def test_a_busy_service_is_a_transient_failure_and_nothing_else_is() -> None:
    with pytest.raises(StorageThrottled) as caught, translated("writing y"):
        raise answered(HttpResponseError, 500)
    assert isinstance(caught.value, TransientError)
    with pytest.raises(NotFound) as missing, translated("reading y"):
        raise answered(ResourceNotFoundError, 404)
    assert not isinstance(missing.value, StorageThrottled)


def test_what_is_not_an_sdk_error_passes_unchanged() -> None:
    own = NotFound("already translated", 404)
    with pytest.raises(NotFound) as caught, translated("outer"):
        raise own
    assert caught.value is own
    with pytest.raises(KeyError), translated("z"):
        raise KeyError("not storage")
    assert failure_name(KeyError("k")) == "KeyError"
