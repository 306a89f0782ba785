"""The lean blob reader against a real Azurite: content, ETag pinning, errors, bounded memory."""

from __future__ import annotations

import os
import tracemalloc
import uuid
from collections.abc import Iterator

import pytest
from azure.storage.blob import BlobServiceClient, ContainerClient

from devstack.azurite import Azurite
from shared.blobio.reader import (
    BlobAccessDenied,
    BlobChanged,
    BlobReader,
    SharedKey,
    reader_for,
)
from shared.blobio.stream import BlobStream
from shared.core.errors import InputMissing

pytestmark = pytest.mark.integration

CHUNK = 1000


@pytest.fixture
def container(azurite: Azurite) -> Iterator[ContainerClient]:
    service = BlobServiceClient.from_connection_string(azurite.connection_string)
    client = service.create_container(f"reader{uuid.uuid4().hex[:10]}")
    yield client
    client.delete_container()


def upload(container: ContainerClient, name: str, data: bytes) -> BlobReader:
    blob = container.upload_blob(name, data, overwrite=True)
    return reader_for(blob)


def stream(container: ContainerClient, reader: BlobReader, name: str, depth: int = 3) -> BlobStream:
    return BlobStream(reader.ranges(container.container_name, name), CHUNK, depth)


SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 7, 17 * CHUNK - 1]


@pytest.mark.parametrize("size", SIZES)
def test_content_is_the_blob_at_every_range_boundary(container: ContainerClient, size: int) -> None:
    data = os.urandom(size)
    reader = upload(container, "dir/a b+ü.bin", data)
    with stream(container, reader, "dir/a b+ü.bin") as s:
        assert s.size == len(data) and s.read() == data
    for buffer_size in (1, 7, CHUNK - 3, CHUNK, 3 * CHUNK + 1):  # reads that straddle the ranges
        out = bytearray()
        buffer = bytearray(buffer_size)
        with stream(container, reader, "dir/a b+ü.bin", depth=2) as s:
            while n := s.readinto(buffer):
                out += buffer[:n]
        assert bytes(out) == data


def test_default_sizes_and_read_range(container: ContainerClient) -> None:
    data = os.urandom(3 * 1024 * 1024 + 5)
    reader = upload(container, "big.bin", data)
    with reader.open(container.container_name, "big.bin") as s:
        assert s.read() == data
        etag = s.etag
    assert reader.read_range(container.container_name, "big.bin", 10, 100, etag) == data[10:110]
    assert reader.read_range(container.container_name, "big.bin", len(data) - 3, 100) == data[-3:]


def test_a_blob_replaced_mid_read_fails_as_changed(container: ContainerClient) -> None:
    reader = upload(container, "moving.csv", b"a" * (20 * CHUNK))
    with stream(container, reader, "moving.csv", depth=1) as s:
        container.upload_blob("moving.csv", b"b" * (20 * CHUNK), overwrite=True)
        with pytest.raises(BlobChanged, match="changed while it was being read"):
            s.read()
    with pytest.raises(BlobChanged):
        reader.read_range(container.container_name, "moving.csv", 0, 10, etag=s.etag)


def test_missing_blob_and_container(container: ContainerClient) -> None:
    reader = upload(container, "here.csv", b"x")
    with pytest.raises(InputMissing, match=r"does not exist \(blob not found\)"):
        reader.open(container.container_name, "absent.csv")
    with pytest.raises(InputMissing, match=r"does not exist \(container not found\)"):
        reader.open("nosuchcontainer", "absent.csv")


def test_a_wrong_key_is_access_denied(container: ContainerClient) -> None:
    good = upload(container, "here.csv", b"x")
    auth = good.auth
    assert isinstance(auth, SharedKey)
    url = container.url.rsplit("/", 1)[0]
    bad = BlobReader(url, SharedKey(auth.account, b"not the key"))
    with pytest.raises(BlobAccessDenied, match="403"):
        bad.open(container.container_name, "here.csv")


def test_memory_is_bounded_by_the_buffers(container: ContainerClient) -> None:
    data = os.urandom(64 * CHUNK)
    reader = upload(container, "many.bin", data)
    buffer = bytearray(300)
    tracemalloc.start()
    try:
        with stream(container, reader, "many.bin", depth=3) as s:
            total = 0
            while n := s.readinto(buffer):
                total += n
            assert total == len(data)
            assert s.buffers_allocated <= 4  # depth + 1 buffers, reused 16 times over
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * CHUNK + 200_000  # never the whole blob (64 chunks)
