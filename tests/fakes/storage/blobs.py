"""Blob containers in memory: what azure-storage-blob's service, container and blob clients do for
the app (see the package's docstring for what is faithful)."""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, cast

from azure.core.exceptions import HttpResponseError
from azure.core.paging import ItemPaged
from azure.storage.blob import (
    BlobBlock,
    BlobProperties,
    BlobType,
    ContainerProperties,
    ContentSettings,
    FilteredBlob,
)
from azure.storage.blob._serialize import get_modify_conditions

from tests.fakes.storage.common import (
    IDENTIFIER,
    LIST_PAGE,
    TAG_CHARS,
    blob_error,
    check_name,
    refuse_unknown,
    same_page,
    whole_seconds,
)

if TYPE_CHECKING:
    from tests.fakes.storage.account import MemoryStorage


@dataclass
class BlobRecord:
    data: bytes
    etag: str
    last_modified: datetime
    created: datetime
    metadata: dict[str, str]
    tags: dict[str, str]
    content_settings: ContentSettings
    blocks: tuple[tuple[str, int], ...] = ()
    """Committed blocks (id, size) of a blob made by Put Block List; none for a Put Blob."""


@dataclass
class ContainerRecord:
    name: str
    etag: str
    last_modified: datetime
    metadata: dict[str, str]
    blobs: dict[str, BlobRecord] = field(default_factory=dict)
    staged: dict[str, dict[str, bytes]] = field(default_factory=dict)
    """Uncommitted blocks by blob name, then block id (Put Block); a commit or a Put Blob drops them."""


# -- blobs --------------------------------------------------------------------------------------


def _blob_bytes(data: Any, encoding: str) -> bytes:
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    if isinstance(data, str):
        return data.encode(encoding)
    if hasattr(data, "read"):
        read = cast(IO[Any], data).read()
        return read.encode(encoding) if isinstance(read, str) else bytes(read)
    if isinstance(data, Iterable):
        return b"".join(bytes(chunk) for chunk in data)
    raise TypeError(f"unsupported data type: {type(data)}")


def _check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(metadata or {})
    for key, value in out.items():
        if not IDENTIFIER.match(key) or not str(value).isascii():
            raise blob_error(
                400,
                "InvalidMetadata",
                "The metadata specified is invalid. It has characters that are not permitted.",
            )
    return out


def _check_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(tags or {})
    if len(out) > 10 or any(
        not 1 <= len(k) <= 128 or len(v) > 256 or not TAG_CHARS.match(k) or not TAG_CHARS.match(v)
        for k, v in out.items()
    ):
        raise blob_error(
            400,
            "InvalidTag",
            "The tags specified are invalid. It contains characters that are not permitted.",
        )
    return out


def _unmet(blob: BlobRecord | None, conditions: Any) -> HttpResponseError | None:
    """The answer to a write whose conditions fail (None when they hold)."""
    if conditions.if_none_match is not None:
        if conditions.if_none_match != "*":
            raise NotImplementedError("If-None-Match with an ETag")
        if blob is not None:
            return blob_error(409, "BlobAlreadyExists", "The specified blob already exists.")
    not_met = blob_error(
        412, "ConditionNotMet", "The condition specified using HTTP conditional header(s) is not met."
    )
    if conditions.if_match is not None and (
        blob is None or (conditions.if_match != "*" and conditions.if_match != blob.etag)
    ):
        return not_met
    since = conditions.if_unmodified_since
    if since is not None and blob is not None and blob.last_modified > whole_seconds(since):
        return not_met
    since = conditions.if_modified_since
    if since is not None and (blob is None or blob.last_modified <= whole_seconds(since)):
        return not_met
    return None


def _properties(container: str, name: str, blob: BlobRecord, metadata: bool = True) -> BlobProperties:
    props = BlobProperties()
    props.name = name
    props.container = container
    props.etag = blob.etag
    props.last_modified = blob.last_modified
    props.creation_time = blob.created
    props.size = len(blob.data)
    props.metadata = dict(blob.metadata) if metadata else {}
    props.content_settings = copy.copy(blob.content_settings)
    props.blob_type = BlobType.BLOCKBLOB
    props.tag_count = len(blob.tags) or None
    return props


class MemoryDownloader:
    """What `download_blob` gives: the bytes of the range asked for, and the blob's properties
    (`content_range` names the range and the blob's full size)."""

    def __init__(self, data: bytes, properties: BlobProperties) -> None:
        self._data = data
        self.properties = properties
        self.size = len(data)
        self.name = properties.name
        self.container = properties.container

    def readall(self) -> bytes:
        return self._data


def _block(block_id: str, size: int) -> BlobBlock:
    block = BlobBlock(block_id=block_id)
    block.size = size
    return block


class MemoryBlobClient:
    """One blob of a `MemoryStorage` (azure-storage-blob's `BlobClient`, as the app uses it)."""

    def __init__(self, account: MemoryStorage, container: str, blob: str) -> None:
        self.account = account
        self.container_name = container
        self.blob_name = blob
        self.url = account.url(f"{container}/{blob}")

    def _path(self) -> str:
        return f"{self.container_name}/{self.blob_name}"

    def upload_blob(
        self,
        data: Any,
        blob_type: BlobType | str = BlobType.BLOCKBLOB,
        length: int | None = None,
        metadata: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if blob_type not in (BlobType.BLOCKBLOB, "BlockBlob"):
            raise NotImplementedError("only block blobs")
        overwrite = bool(kwargs.pop("overwrite", False))
        conditions = get_modify_conditions(kwargs)  # the SDK's own reading of etag / match_condition
        if not overwrite and not any(
            (
                conditions.if_match,
                conditions.if_none_match,
                conditions.if_modified_since,
                conditions.if_unmodified_since,
            )
        ):
            conditions.if_none_match = "*"  # what the SDK sends for overwrite=False
        raw = _blob_bytes(data, kwargs.pop("encoding", "UTF-8"))
        if length is not None:
            raw = raw[:length]
        settings = kwargs.pop("content_settings", None) or ContentSettings()
        tags = _check_tags(kwargs.pop("tags", None))
        meta = _check_metadata(metadata)
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "upload_blob")
        with self.account.lock:
            self.account.log("PUT", self._path())
            container = self.account.container(self.container_name)
            existing = container.blobs.get(self.blob_name)
            failed = _unmet(existing, conditions)
            if failed is not None:
                raise failed
            now = whole_seconds(self.account.clock())
            blob = BlobRecord(
                raw,
                self.account.blob_etag(),
                now,
                existing.created if existing else now,
                meta,
                tags,
                copy.copy(settings),
            )
            container.blobs[self.blob_name] = blob
            container.staged.pop(self.blob_name, None)
            return {
                "etag": blob.etag,
                "last_modified": blob.last_modified,
                "content_md5": bytearray(hashlib.md5(raw).digest()),
                "request_server_encrypted": True,
            }

    def download_blob(
        self, offset: int | None = None, length: int | None = None, **kwargs: Any
    ) -> MemoryDownloader:
        kwargs.pop("max_concurrency", None)
        kwargs.pop("timeout", None)
        if kwargs.pop("encoding", None) is not None:
            raise NotImplementedError("download_blob(encoding=...)")
        conditions = get_modify_conditions(kwargs)  # the SDK's own reading of etag / match_condition
        refuse_unknown(kwargs, "download_blob")
        if length is not None and offset is None:
            raise ValueError("Offset value must not be None if length is set.")
        with self.account.lock:
            self.account.log("GET", self._path())
            blob = self.account.container(self.container_name).blobs.get(self.blob_name)
            if blob is None:
                raise blob_error(404, "BlobNotFound", "The specified blob does not exist.")
            failed = _unmet(blob, conditions)
            if failed is not None:
                raise failed
            total = len(blob.data)
            if offset is None:
                start, end = 0, total - 1
                content_range = f"bytes 0-{total - 1}/{total}" if total else None
            else:
                if offset >= total:  # a ranged GET of an empty blob too (the SDK raises it)
                    raise blob_error(
                        416,
                        "InvalidRange",
                        "The range specified is invalid for the current size of the resource.",
                    )
                start = offset
                end = min(total - 1, offset + length - 1 if length is not None else total - 1)
                content_range = f"bytes {start}-{end}/{total}"
            data = blob.data[start : end + 1]
            props = _properties(self.container_name, self.blob_name, blob)
            props.content_range = content_range
            props.size = len(data)
            return MemoryDownloader(data, props)

    def stage_block(
        self, block_id: str, data: Any, length: int | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Put Block: kept uncommitted until a commit names it (a staged id staged again is replaced)."""
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "stage_block")
        raw = _blob_bytes(data, "UTF-8")
        raw = raw if length is None else raw[:length]
        with self.account.lock:
            self.account.log("PUT", f"{self._path()}?comp=block")
            container = self.account.container(self.container_name)
            container.staged.setdefault(self.blob_name, {})[block_id] = raw
            return {"content_md5": bytearray(hashlib.md5(raw).digest()), "request_server_encrypted": True}

    def commit_block_list(self, block_list: list[Any], **kwargs: Any) -> dict[str, Any]:
        """Put Block List of uncommitted blocks only (the app restages every block of a blob); the
        blob becomes their bytes in order, and every other uncommitted block is dropped."""
        settings = kwargs.pop("content_settings", None) or ContentSettings()
        meta = _check_metadata(kwargs.pop("metadata", None))
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "commit_block_list")
        with self.account.lock:
            self.account.log("PUT", f"{self._path()}?comp=blocklist")
            container = self.account.container(self.container_name)
            staged = container.staged.get(self.blob_name, {})
            ids = [getattr(block, "id", block) for block in block_list]
            if any(i not in staged for i in ids):
                raise blob_error(400, "InvalidBlockList", "The specified block list is invalid.")
            existing = container.blobs.get(self.blob_name)
            now = whole_seconds(self.account.clock())
            raw = b"".join(staged[i] for i in ids)
            blob = BlobRecord(
                raw,
                self.account.blob_etag(),
                now,
                existing.created if existing else now,
                meta,
                {},
                copy.copy(settings),
                tuple((i, len(staged[i])) for i in ids),
            )
            container.blobs[self.blob_name] = blob
            container.staged.pop(self.blob_name, None)
            return {"etag": blob.etag, "last_modified": blob.last_modified}

    def get_block_list(
        self, block_list_type: str = "committed", **kwargs: Any
    ) -> tuple[list[Any], list[Any]]:
        """(committed, uncommitted) blocks, each a BlobBlock with its id and size."""
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "get_block_list")
        with self.account.lock:
            self.account.log("GET", f"{self._path()}?comp=blocklist")
            container = self.account.container(self.container_name)
            staged = container.staged.get(self.blob_name, {})
            blob = container.blobs.get(self.blob_name)
            if blob is None and not staged:
                raise blob_error(404, "BlobNotFound", "The specified blob does not exist.")
            committed = [_block(i, n) for i, n in blob.blocks] if blob is not None else []
            uncommitted = [_block(i, len(b)) for i, b in staged.items()]
            if block_list_type == "committed":
                return committed, []
            if block_list_type == "uncommitted":
                return [], uncommitted
            return committed, uncommitted

    def exists(self, **kwargs: Any) -> bool:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "exists")
        with self.account.lock:
            self.account.log("HEAD", self._path())
            container = self.account.containers.get(self.container_name)
            return container is not None and self.blob_name in container.blobs

    def delete_blob(self, delete_snapshots: str | None = None, **kwargs: Any) -> None:
        conditions = get_modify_conditions(kwargs)
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "delete_blob")
        with self.account.lock:
            self.account.log("DELETE", self._path())
            container = self.account.container(self.container_name)
            blob = container.blobs.get(self.blob_name)
            if blob is None:
                raise blob_error(404, "BlobNotFound", "The specified blob does not exist.")
            failed = _unmet(blob, conditions)
            if failed is not None:
                raise failed
            del container.blobs[self.blob_name]


@dataclass(frozen=True)
class _TagTerm:
    key: str
    op: str
    value: str

    def holds(self, tags: Mapping[str, str]) -> bool:
        have = tags.get(self.key)
        if have is None:
            return False
        return {
            "=": have == self.value,
            "<": have < self.value,
            "<=": have <= self.value,
            ">": have > self.value,
            ">=": have >= self.value,
        }[self.op]


_TAG_TERM = re.compile(r"""\s*"([^"]+)"\s*(<=|>=|=|<|>)\s*'([^']*)'\s*""")


def parse_tag_filter(expression: str) -> list[_TagTerm]:
    """A Find Blobs by Tags expression: `"key" op 'value'` terms joined by AND."""
    terms = []
    for part in re.split(r"\s+AND\s+", expression.strip(), flags=re.IGNORECASE):
        found = _TAG_TERM.fullmatch(part)
        if found is None:
            raise NotImplementedError(f"tag filter not understood by the in-memory account: {expression!r}")
        terms.append(_TagTerm(*found.groups()))
    return terms


class MemoryContainerClient:
    """One container of a `MemoryStorage` (azure-storage-blob's `ContainerClient`, as used)."""

    def __init__(self, account: MemoryStorage, name: str) -> None:
        self.account = account
        self.container_name = name
        self.url = account.url(name)

    def create_container(
        self, metadata: Mapping[str, str] | None = None, public_access: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "create_container")
        check_name(self.container_name, blob_error)
        with self.account.lock:
            self.account.log("PUT", self.container_name)
            if self.container_name in self.account.containers:
                raise blob_error(409, "ContainerAlreadyExists", "The specified container already exists.")
            now = whole_seconds(self.account.clock())
            made = ContainerRecord(
                self.container_name, self.account.blob_etag(), now, _check_metadata(metadata)
            )
            self.account.containers[self.container_name] = made
            return {"etag": made.etag, "last_modified": made.last_modified}

    def get_container_properties(self, **kwargs: Any) -> ContainerProperties:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "get_container_properties")
        with self.account.lock:
            self.account.log("GET", self.container_name)
            found = self.account.container(self.container_name)
            props = ContainerProperties()
            props.name = found.name
            props.etag = found.etag
            props.last_modified = found.last_modified
            props.metadata = dict(found.metadata)
            return props

    def get_blob_client(self, blob: str, snapshot: str | None = None) -> MemoryBlobClient:
        if snapshot is not None:
            raise NotImplementedError("snapshots")
        return MemoryBlobClient(self.account, self.container_name, blob)

    def upload_blob(
        self,
        name: str,
        data: Any,
        blob_type: BlobType | str = BlobType.BLOCKBLOB,
        length: int | None = None,
        metadata: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> MemoryBlobClient:
        blob = self.get_blob_client(name)
        blob.upload_blob(data, blob_type, length, metadata, **kwargs)
        return blob

    def download_blob(
        self, blob: str, offset: int | None = None, length: int | None = None, **kwargs: Any
    ) -> MemoryDownloader:
        return self.get_blob_client(blob).download_blob(offset, length, **kwargs)

    def delete_blob(self, blob: str, delete_snapshots: str | None = None, **kwargs: Any) -> None:
        self.get_blob_client(blob).delete_blob(delete_snapshots, **kwargs)

    def list_blobs(
        self, name_starts_with: str | None = None, include: str | list[str] | None = None, **kwargs: Any
    ) -> ItemPaged[BlobProperties]:
        size = min(int(kwargs.pop("results_per_page", None) or LIST_PAGE), LIST_PAGE)
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "list_blobs")
        wanted = {include} if isinstance(include, str) else set(include or ())
        if wanted - {"metadata", "tags"}:
            raise NotImplementedError(f"list_blobs(include={sorted(wanted)})")
        prefix = name_starts_with or ""

        def page(marker: str | None) -> tuple[str | None, list[BlobProperties]]:
            with self.account.lock:
                self.account.log("GET", self.container_name)
                blobs = self.account.container(self.container_name).blobs
                names = sorted(n for n in blobs if n.startswith(prefix) and (marker is None or n >= marker))
                items = []
                for name in names[:size]:
                    props = _properties(self.container_name, name, blobs[name], "metadata" in wanted)
                    if "tags" in wanted:
                        props.tags = dict(blobs[name].tags) or None
                    items.append(props)
                return (names[size] if len(names) > size else None), items

        return ItemPaged(page, same_page)

    def find_blobs_by_tags(self, filter_expression: str, **kwargs: Any) -> ItemPaged[FilteredBlob]:
        size = min(int(kwargs.pop("results_per_page", None) or LIST_PAGE), LIST_PAGE)
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "find_blobs_by_tags")
        terms = parse_tag_filter(filter_expression)

        def page(marker: str | None) -> tuple[str | None, list[FilteredBlob]]:
            with self.account.lock:
                self.account.log("GET", self.container_name)
                blobs = self.account.container(self.container_name).blobs
                names = sorted(
                    n
                    for n, b in blobs.items()
                    if all(t.holds(b.tags) for t in terms) and (marker is None or n >= marker)
                )
                items = [
                    FilteredBlob(
                        name=n,
                        container_name=self.container_name,
                        tags={t.key: blobs[n].tags[t.key] for t in terms},
                    )
                    for n in names[:size]
                ]
                return (names[size] if len(names) > size else None), items

        return ItemPaged(page, same_page)


class MemoryBlobService:
    """The Blob service of a `MemoryStorage` (azure-storage-blob's `BlobServiceClient`, as used)."""

    def __init__(self, account: MemoryStorage) -> None:
        self.account = account
        self.url = account.url()
        self.account_name = account.account

    def get_container_client(self, container: str) -> MemoryContainerClient:
        return MemoryContainerClient(self.account, container)
