"""Where a Spark run leaves its result and its error report, and how the function reads them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.blob import BlobClient, ContainerClient

from shared.errors import StorageThrottled
from shared.limits import BlobTooLarge, read_capped
from shared.storage import is_throttled

T = TypeVar("T")
ERROR_MAX_BYTES: Final = 1024 * 1024
"""An error report is a few hundred bytes; a larger one is not read."""
END_BYTES: Final = 4096
"""Bytes read at each end of a result document too large to read whole."""
_TAIL = re.compile(rb'\],"input_rows":(\d+),"engine":("(?:[^"\\]|\\.)*"),"elapsed_s":(-?[0-9.eE+-]+)\}\s*$')


def result_blob(job_id: str) -> str:
    """The result document's name in the results container (same as the inline engine's)."""
    return f"{job_id}.json"


def error_blob(job_id: str, submission: int) -> str:
    """The error report a failing Spark run writes (one per submission)."""
    return f"_spark/{job_id}/error-s{submission}.json"


@dataclass(frozen=True)
class RunError:
    """What the job reported before exiting non-zero."""

    message: str
    kind: str
    """input_data | payload | unexpected: input_data and payload cannot be fixed by a new run."""

    @property
    def permanent(self) -> bool:
        return self.kind in ("input_data", "payload")


def read_result(container: ContainerClient, job_id: str, max_bytes: int) -> dict[str, Any] | None:
    """The result document if it exists and belongs to `job_id`; None otherwise.

    A document over `max_bytes` (a run with more groups than MAX_GROUPS allows) is never read
    whole: its two ends are, to check whose it is, and the answer has `input_rows`, `engine`,
    `elapsed_s` and `result_bytes` but no `rows`.
    """
    blob = container.get_blob_client(result_blob(job_id))
    try:
        doc = _read_json(blob, max_bytes)
    except BlobTooLarge as big:
        return _ends(blob, job_id, big.size)
    if doc is None or doc.get("id") != job_id or not isinstance(doc.get("rows"), list):
        return None
    return doc


def read_error(container: ContainerClient, job_id: str, submission: int) -> RunError | None:
    """The error report of one submission, if the job managed to write one."""
    try:
        doc = _read_json(container.get_blob_client(error_blob(job_id, submission)), ERROR_MAX_BYTES)
    except BlobTooLarge:
        return None
    if doc is None or doc.get("id") != job_id or doc.get("submission") != submission:
        return None
    return RunError(message=str(doc.get("error") or ""), kind=str(doc.get("kind") or "unexpected"))


def _ends(blob: BlobClient, job_id: str, size: int) -> dict[str, Any] | None:
    """The members of a large result document other than its rows, from its first and last bytes.

    Both engines write the document compactly, members in the order of `result_document`:
    `{"id":...,"rows":[...],"input_rows":N,"engine":"...","elapsed_s":X}`.
    """

    def head() -> tuple[bytes, str | None]:
        downloader = blob.download_blob(offset=0, length=END_BYTES, max_concurrency=1)
        return downloader.readall(), downloader.properties.etag

    def tail(etag: str | None) -> bytes:
        start = max(0, size - END_BYTES)
        downloader = blob.download_blob(
            offset=start,
            length=size - start,
            etag=etag,
            match_condition=MatchConditions.IfNotModified,
            max_concurrency=1,
        )
        return downloader.readall()

    try:
        first, etag = _storage(head, blob.blob_name)
        last = _storage(lambda: tail(etag), blob.blob_name)
    except ResourceNotFoundError:
        return None
    prefix = ('{"id":' + json.dumps(job_id, ensure_ascii=False) + ',"rows":[').encode()
    match = _TAIL.search(last)
    if not first.startswith(prefix) or match is None:
        return None
    try:
        engine = json.loads(match.group(2))
        elapsed = float(match.group(3))
    except ValueError:
        return None
    return {
        "id": job_id,
        "input_rows": int(match.group(1)),
        "engine": engine,
        "elapsed_s": elapsed,
        "result_bytes": size,
    }


def _read_json(blob: BlobClient, max_bytes: int) -> dict[str, Any] | None:
    """The blob as a JSON object (None if absent or not one); BlobTooLarge over `max_bytes`."""
    try:
        raw = _storage(lambda: read_capped(blob, max_bytes), blob.blob_name)
    except ResourceNotFoundError:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _storage(call: Callable[[], T], name: str) -> T:
    """One storage call; a busy or unreachable service is StorageThrottled."""
    try:
        return call()
    except ResourceNotFoundError:
        raise
    except HttpResponseError as exc:
        if is_throttled(exc):
            raise StorageThrottled(f"storage busy while reading {name}") from None
        raise
    except Exception as exc:
        if is_throttled(exc):
            raise StorageThrottled(f"storage unreachable while reading {name}") from None
        raise
