"""The `Blobs` port on an SDK container client: one request a call, SDK errors translated."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.storage.blob import ContainerClient, ContentSettings

from shared.blobio.reader import reader_for
from shared.blobio.stream import Ranges
from shared.core.documents import TagQuery
from shared.storage.failures import AlreadyExists, ConditionFailed, NotFound, translated
from shared.storage.limits import read_capped
from shared.storage.ports import BlobInfo
from shared.storage.staged import BLOCK_BYTES, StagedBlobWriter


class AzureBlobs:
    """The blobs of one container."""

    def __init__(self, container: ContainerClient) -> None:
        self.container = container

    @property
    def name(self) -> str:
        return str(self.container.container_name)

    def _label(self, name: str) -> str:
        return f"{self.name}/{name}"

    def read(self, name: str) -> bytes:
        with translated(f"reading {self._label(name)}"):
            return bytes(self.container.download_blob(name).readall())

    def read_capped(self, name: str, limit: int) -> bytes:
        with translated(f"reading {self._label(name)}"):
            return read_capped(self.container.get_blob_client(name), limit)

    def read_range(self, name: str, offset: int, length: int, etag: str | None = None) -> tuple[bytes, str]:
        condition: dict[str, Any] = (
            {} if etag is None else {"etag": etag, "match_condition": MatchConditions.IfNotModified}
        )
        with translated(f"reading {self._label(name)}"):
            downloader = self.container.get_blob_client(name).download_blob(
                offset=offset, length=length, max_concurrency=1, **condition
            )
            return bytes(downloader.readall()), str(downloader.properties.etag)

    def write(
        self, name: str, data: bytes | str, *, content_type: str | None = None, overwrite: bool = True
    ) -> None:
        settings = ContentSettings(content_type=content_type) if content_type else None
        extra: dict[str, Any] = {} if overwrite else {"match_condition": MatchConditions.IfMissing}
        with translated(f"writing {self._label(name)}"):
            self.container.get_blob_client(name).upload_blob(
                data, overwrite=overwrite, content_settings=settings, **extra
            )

    def writer(self, name: str, content_type: str, block_bytes: int | None = None) -> StagedBlobWriter:
        return StagedBlobWriter(
            self.container.get_blob_client(name), content_type, block_bytes or BLOCK_BYTES
        )

    def exists(self, name: str) -> bool:
        with translated(f"looking for {self._label(name)}"):
            return bool(self.container.get_blob_client(name).exists())

    def delete(self, name: str, unmodified_since: datetime | None = None) -> bool:
        extra: dict[str, Any] = {} if unmodified_since is None else {"if_unmodified_since": unmodified_since}
        try:
            with translated(f"deleting {self._label(name)}"):
                self.container.delete_blob(name, **extra)
        except (ConditionFailed, NotFound):
            return False
        return True

    def pages(self, prefix: str = "", size: int | None = None) -> Iterator[list[BlobInfo]]:
        with translated(f"listing {self._label(prefix)}"):
            for page in self.container.list_blobs(
                name_starts_with=prefix or None, results_per_page=size
            ).by_page():
                yield [BlobInfo(b.name, b.last_modified, int(b.size or 0)) for b in page]

    def found(self, query: TagQuery, size: int | None = None) -> Iterator[list[str]]:
        with translated(f"finding blobs of {self.name}"):
            for page in self.container.find_blobs_by_tags(
                query.expression(), results_per_page=size
            ).by_page():
                yield [blob.name for blob in page]

    def check(self) -> None:
        with translated(f"container {self.name}"):
            self.container.get_container_properties()

    def create(self) -> None:
        with contextlib.suppress(AlreadyExists), translated(f"creating container {self.name}"):
            self.container.create_container()

    def ranges(self, name: str) -> Ranges:
        return reader_for(self.container).ranges(self.name, name)
