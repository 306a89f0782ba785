"""The storage-error boundary names codes as the service sends them (no I/O)."""

from __future__ import annotations

from azure.core.exceptions import HttpResponseError
from azure.storage.blob import StorageErrorCode as BlobCode
from azure.storage.queue import StorageErrorCode as QueueCode

from shared.storage.errors import GONE_MESSAGE_CODES, error_code


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
