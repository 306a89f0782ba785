"""How the aggregate job (spark_jobs/aggregate_job.py) reaches storage: `BlobAccess` (the Blob
SDK's client and the app's ranged reader), and the writers of its result and error documents,
`BlobResults` (Blob SDK) and `HadoopResults` (Hadoop's FileSystem: abfss://, wasbs://), with
`open_data` for a data output (parquet, csv) written as a stream: staged blocks committed once
(Blob SDK; block ids by index, so a new run replaces the blob whole), or one Hadoop output stream.

Shipped to the cluster in the engine zip (`JOB_MODULES`); imports the Azure SDK only inside
its functions.
"""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BlobAccess:
    """How the driver and the tasks reach the storage account through the Blob SDK (picklable)."""

    connection_string: str | None = field(default=None, repr=False)
    endpoint: str | None = None

    def service(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        kw: dict[str, Any] = {"retry_total": 5, "connection_timeout": 20, "read_timeout": 120}
        if self.connection_string:
            return BlobServiceClient.from_connection_string(self.connection_string, **kw)
        from azure.identity import DefaultAzureCredential

        return BlobServiceClient(str(self.endpoint), credential=DefaultAzureCredential(), **kw)

    def ranges(self) -> Any:
        """The app's lean ranged reader (`shared.blobio.reader`) with the same account and credential."""
        from shared.blobio.reader import reader_for

        return reader_for(self.service())


class BlobResults:
    """Writes result and error documents with the Blob SDK."""

    def __init__(self, access: BlobAccess, container: str) -> None:
        self.container = access.service().get_container_client(container)

    def create(self, name: str, data: bytes) -> bool:
        """Create `name` unless it exists; False if it did."""
        from azure.core.exceptions import ResourceExistsError

        try:
            self.container.upload_blob(name, data, overwrite=False, content_settings=_json_settings())
        except ResourceExistsError:
            return False
        return True

    def put(self, name: str, data: bytes) -> None:
        self.container.upload_blob(name, data, overwrite=True, content_settings=_json_settings())

    def open_data(self, name: str, content_type: str) -> BlockWriter:
        return BlockWriter(self.container.get_blob_client(name), content_type)

    def read(self, name: str) -> bytes | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return bytes(self.container.download_blob(name).readall())
        except ResourceNotFoundError:
            return None


BLOCK_BYTES = 4 * 1024 * 1024


class BlockWriter:
    """A block blob written as a stream (the driver's twin of the app's
    `shared.storage.staged.StagedBlobWriter`, without the app's storage package)."""

    def __init__(self, blob: Any, content_type: str, block_bytes: int = BLOCK_BYTES) -> None:
        self.blob, self.content_type, self.block_bytes = blob, content_type, block_bytes
        self.buffer = bytearray()
        self.ids: list[str] = []
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.buffer += view
        self.size += len(view)
        while len(self.buffer) >= self.block_bytes:
            self._stage(bytes(self.buffer[: self.block_bytes]))
            del self.buffer[: self.block_bytes]
        return len(view)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        return False

    def _stage(self, chunk: bytes) -> None:
        ident = base64.b64encode(f"block-{len(self.ids):08d}".encode("ascii")).decode("ascii")
        self.blob.stage_block(ident, chunk, length=len(chunk))
        self.ids.append(ident)

    def commit(self) -> int:
        from azure.storage.blob import BlobBlock, ContentSettings

        if self.buffer:
            self._stage(bytes(self.buffer))
            self.buffer.clear()
        self.blob.commit_block_list(
            [BlobBlock(block_id=i) for i in self.ids],
            content_settings=ContentSettings(content_type=self.content_type),
        )
        return self.size


class HadoopWriter:
    """A file written through one Hadoop output stream (created with overwrite)."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.out.write(bytearray(view))
        self.size += len(view)
        return len(view)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        return False

    def commit(self) -> int:
        self.out.close()
        return self.size


def _json_settings() -> Any:
    from azure.storage.blob import ContentSettings

    return ContentSettings(content_type="application/json; charset=utf-8")


class HadoopResults:
    """Writes result and error documents through Hadoop's FileSystem (abfss://, wasbs://)."""

    def __init__(self, spark: Any, base_url: str) -> None:
        self.jvm = spark.sparkContext._jvm
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()
        self.base = base_url.rstrip("/") + "/"

    def _path(self, name: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path(self.base + name)

    def _write(self, path: Any, data: bytes, overwrite: bool) -> None:
        fs = path.getFileSystem(self.conf)
        out = fs.create(path, overwrite)
        try:
            out.write(bytearray(data))
        finally:
            out.close()

    def create(self, name: str, data: bytes) -> bool:
        final = self._path(name)
        fs = final.getFileSystem(self.conf)
        if fs.exists(final):
            return False
        tmp = self._path(f"_spark/tmp/{name}.{os.getpid()}.{time.time_ns()}")
        self._write(tmp, data, True)
        if fs.rename(tmp, final):  # atomic; fails if the target exists
            return True
        fs.delete(tmp, False)
        return False

    def put(self, name: str, data: bytes) -> None:
        self._write(self._path(name), data, True)

    def open_data(self, name: str, content_type: str) -> HadoopWriter:
        del content_type  # a Hadoop file has none
        path = self._path(name)
        return HadoopWriter(path.getFileSystem(self.conf).create(path, True))

    def read(self, name: str) -> bytes | None:
        path = self._path(name)
        fs = path.getFileSystem(self.conf)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            return bytes(self.jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()
