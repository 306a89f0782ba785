"""What the services of the SDK-imitating account share: the service's limits and the clocks (the
shipped in-memory account's), and errors built by the SDKs' own error processing (the same
classes, status codes and `error_code`s as the SDKs raise)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from http import HTTPStatus
from typing import Any, NoReturn, cast

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.blob._shared.response_handlers import process_storage_error as _process_blob_error
from azure.storage.queue._shared.response_handlers import process_storage_error as _process_queue_error

from shared.storage.memory_account import ACCOUNT, Clock, real_time
from shared.storage.memory_blobs import LIST_PAGE, LOWER_NAME, TAG_CHARS
from shared.storage.memory_queues import DEFAULT_TTL_S, MAX_MESSAGE_BYTES, MAX_VISIBILITY_S, NEVER

__all__ = [
    "ACCOUNT",
    "DEFAULT_TTL_S",
    "LIST_PAGE",
    "LOWER_NAME",
    "MAX_MESSAGE_BYTES",
    "MAX_VISIBILITY_S",
    "NEVER",
    "TAG_CHARS",
    "Clock",
    "real_time",
]

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def whole_seconds(moment: datetime) -> datetime:
    """A time as the service reports it in headers and listings: whole seconds."""
    return moment.replace(microsecond=0)


# -- errors, built by the SDKs' own error processing ----------------------------------------


class ErrorResponse:
    """The parts of an HTTP error response that azure-core's exceptions and the SDKs read."""

    def __init__(self, status: int, code: str) -> None:
        self.status_code = status
        self.reason = HTTPStatus(status).phrase
        self.headers = {"x-ms-error-code": code}
        self.content_type = "application/xml"

    def text(self, encoding: str | None = None) -> str:
        return ""


def raw_error(status: int, code: str, message: str) -> HttpResponseError:
    """What the SDKs' generated layer raises for an answer (its error map: 404 and 409), before the
    client's error processing."""
    kind: type[HttpResponseError] = {404: ResourceNotFoundError, 409: ResourceExistsError}.get(
        status, HttpResponseError
    )
    return kind(message=message, response=cast(Any, ErrorResponse(status, code)))


def _processed(process: Callable[[HttpResponseError], NoReturn], raw: HttpResponseError) -> HttpResponseError:
    try:
        process(raw)
    except HttpResponseError as exc:
        return exc
    raise AssertionError("the SDK's error processing always raises")


def blob_error(status: int, code: str, message: str) -> HttpResponseError:
    """The exception azure-storage-blob raises for this answer."""
    return _processed(_process_blob_error, raw_error(status, code, message))


def queue_error(status: int, code: str, message: str) -> HttpResponseError:
    """The exception azure-storage-queue raises for this answer."""
    return _processed(_process_queue_error, raw_error(status, code, message))


def refuse_unknown(kwargs: Mapping[str, Any], call: str) -> None:
    if kwargs:
        raise TypeError(
            f"the in-memory {call} does not take {sorted(kwargs)} (teach it, and its contract test)"
        )


def check_name(name: str, error: Callable[[int, str, str], HttpResponseError]) -> None:
    if not 3 <= len(name) <= 63:
        raise error(
            400, "OutOfRangeInput", "The specified resource name length is not within the permissible limits."
        )
    if not LOWER_NAME.match(name):
        raise error(400, "InvalidResourceName", "The specified resource name contains invalid characters.")


def same_page(answer: Any) -> Any:
    """The pager's page as it comes (`ItemPaged`'s extract step)."""
    return answer
