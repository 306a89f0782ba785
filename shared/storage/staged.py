"""A block blob written as a stream: `StagedBlobWriter`, a binary file the app writes to, staged to
storage a block at a time (Put Block) and committed once (Put Block List).

Memory stays at one block (`block_bytes`, 4 MiB by default) whatever the blob's size. Block ids
are the block's index, so a retried write (a new run of the same job) stages the same ids again
and its commit replaces the blob whole: the blocks a dead attempt staged and never committed are
not in the new list and the service drops them. Until the commit, readers see the previous blob
(or none). Storage errors leave translated (`shared.storage.failures`).
"""

from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING, Final

from azure.storage.blob import BlobBlock, ContentSettings

from shared.storage.failures import translated

if TYPE_CHECKING:
    from azure.storage.blob import BlobClient

BLOCK_BYTES: Final = 4 * 1024 * 1024
"""Bytes staged per Put Block."""
MAX_BLOCKS: Final = 50_000
"""The service's limit of committed blocks in one blob."""


def block_id(index: int) -> str:
    """The id of the block at `index` (base64 of a fixed-width number: every id of a blob has the
    same length, as the service requires)."""
    return base64.b64encode(f"block-{index:08d}".encode("ascii")).decode("ascii")


class StagedBlobWriter(io.RawIOBase):
    """A writable binary stream into one block blob: `write` stages full blocks, `commit` stages
    the rest and commits the block list (the blob's content type set by that same request)."""

    def __init__(self, blob: BlobClient, content_type: str, block_bytes: int = BLOCK_BYTES) -> None:
        super().__init__()
        if block_bytes < 1:
            raise ValueError(f"block_bytes must be at least 1, got {block_bytes}")
        self.blob = blob
        self.content_type = content_type
        self.block_bytes = block_bytes
        self.label = f"{blob.container_name}/{blob.blob_name}"
        self._buffer = bytearray()
        self._ids: list[str] = []
        self._written = 0
        self.committed = False

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        if self.committed:
            raise ValueError(f"{self.label}: written after its commit")
        view = memoryview(data).cast("B")
        self._buffer += view
        self._written += len(view)
        while len(self._buffer) >= self.block_bytes:
            self._stage(bytes(self._buffer[: self.block_bytes]))
            del self._buffer[: self.block_bytes]
        return len(view)

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        """Nothing to do: bytes reach storage by whole blocks, and at `commit`."""

    @property
    def size(self) -> int:
        """Bytes written so far (the blob's size once committed)."""
        return self._written

    @property
    def blocks(self) -> int:
        """Blocks staged so far."""
        return len(self._ids)

    def _stage(self, chunk: bytes) -> None:
        if len(self._ids) >= MAX_BLOCKS:
            raise ValueError(f"{self.label}: more than {MAX_BLOCKS} blocks of {self.block_bytes} bytes")
        ident = block_id(len(self._ids))
        with translated(f"staging block {len(self._ids)} of {self.label}"):
            self.blob.stage_block(ident, chunk, length=len(chunk))
        self._ids.append(ident)

    def commit(self) -> int:
        """Stage what is left and commit every block: the blob is now exactly the bytes written
        (replacing any blob of that name). Returns its size."""
        if self.committed:
            return self._written
        if self._buffer:
            self._stage(bytes(self._buffer))
            self._buffer.clear()
        settings = ContentSettings(content_type=self.content_type)
        with translated(f"committing {len(self._ids)} blocks of {self.label}"):
            self.blob.commit_block_list([BlobBlock(block_id=i) for i in self._ids], content_settings=settings)
        self.committed = True
        return self._written

    def close(self) -> None:
        """Nothing to do: a file writer closing its sink (pyarrow's do) leaves it to `commit`; a
        writer given up on is never committed, and nothing it staged becomes visible."""
