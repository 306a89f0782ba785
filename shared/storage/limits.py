"""Least privilege and bounded work per message: which containers a job may read, and reads
that never take more than a limit.

- `input_refusal` (pure): the app's own containers (ledger, results, payloads, poison archive)
  and the host's (`azure-webjobs-*`, any `$`-prefixed name) are never job input; when
  `INPUT_CONTAINERS` is set, only the containers it lists are.
- `read_capped`: a blob's bytes, at most `limit` of them; larger blobs are refused after the
  first response, from its size, never read whole.
- `result_limit_bytes`: the largest result document `MAX_GROUPS` allows, which is also the
  largest one the app reads back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from azure.core.exceptions import HttpResponseError

from shared.core import containers
from shared.core.containers import cut, shown

if TYPE_CHECKING:
    from azure.storage.blob import BlobClient

    from shared.config.settings import Settings

RESULT_ROW_BYTES: Final = 512
"""Bytes of result JSON allowed per group: a row of two 40-character keys and six metrics is
about 200 bytes, so this leaves room for longer keys or more metrics."""
RESULT_BASE_BYTES: Final = 64 * 1024
"""Bytes allowed for the result document's other members (id, input_rows, engine, elapsed_s)."""


def app_containers(settings: Settings) -> dict[str, str]:
    """The app's own containers, each with the setting that names it."""
    return settings.own_containers()


def internal_reason(container: str, settings: Settings) -> str | None:
    """Why `container` is internal (the app's or the host's), or None when it is not."""
    return containers.internal_reason(container, app_containers(settings))


def input_refusal(container: str, settings: Settings, field: str = "payload.input") -> str | None:
    """Why a job may not read `container` (a problem naming `field` and the rule), or None.

    Only the container name and settings are looked at: nothing is read from storage.
    """
    name = shown(container)
    reason = internal_reason(container, settings)
    if reason is not None:
        return f"{field}: container {name} {reason}"
    allowed = settings.input_containers
    if allowed is not None and container not in allowed:
        listed = ", ".join(allowed)
        return f"{field}: container {name} is not in INPUT_CONTAINERS (allowed: {cut(listed)})"
    return None


def result_limit_bytes(max_groups: int) -> int:
    """The largest result document: MAX_GROUPS rows of RESULT_ROW_BYTES, plus RESULT_BASE_BYTES."""
    return max_groups * RESULT_ROW_BYTES + RESULT_BASE_BYTES


class BlobTooLarge(Exception):
    """A blob holds more than the limit of a capped read (`size` is its full size)."""

    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit
        super().__init__(f"the blob is {size} bytes, over the limit of {limit}")


def read_capped(blob: BlobClient, limit: int) -> bytes:
    """The blob's bytes when it holds at most `limit`; BlobTooLarge otherwise.

    One ranged download of at most `limit` + 1 bytes: the blob's full size comes with the first
    response (Content-Range), and a larger blob is refused before anything more is read. Storage
    errors (ResourceNotFoundError included) are the caller's.
    """
    try:
        downloader = blob.download_blob(offset=0, length=limit + 1, max_concurrency=1)
    except HttpResponseError as exc:
        if exc.status_code == 416:  # a ranged GET of an empty blob
            return b""
        raise
    size = total_size(downloader.properties.content_range, downloader.size)
    if size > limit:
        raise BlobTooLarge(size, limit)
    data = downloader.readall()
    if len(data) > limit:  # the range is limit + 1 bytes: this cannot pass it
        raise BlobTooLarge(len(data), limit)
    return bytes(data)


def total_size(content_range: str | None, fallback: int) -> int:
    """A blob's full size from a Content-Range such as 'bytes 0-4194303/123456789'."""
    if content_range and "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        if total.isdigit():
            return int(total)
    return fallback
