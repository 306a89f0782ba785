"""The aggregate handler's pure parts and its blob edge, with in-memory fakes (no network)."""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from shared.aggregation import AggregateResult, parse_aggregate_payload
from shared.blobio.reader import BlobChanged, open_blob_stream
from shared.blobio.stream import Range
from shared.config.settings import Settings, SparkSettings, StorageConnection
from shared.core.errors import InputMissing, NotAvailable, StorageThrottled
from shared.jobs.aggregate import HANDLER, choose_engine, result_document
from shared.jobs.base import Completed, JobContext

R = TypeVar("R")


def recorded(calls: list[str], item: str, result: R) -> R:
    """Appends `item` to `calls` and returns `result`: a one-line stand-in that records its call."""
    calls.append(item)
    return result


# --- fakes -------------------------------------------------------------------------------------


@dataclass
class FakeBlob:
    """Just enough of a blob: ranged reads (`shared.blobio.stream.Ranges`) and uploads."""

    container_name: str
    blob_name: str
    store: dict[tuple[str, str], bytes]
    fail_at: dict[int, Exception] = field(default_factory=dict)
    calls: list[tuple[int, int, str | None]] = field(default_factory=list)
    uploads: list[dict[str, Any]] = field(default_factory=list)
    containers: set[str] = field(default_factory=lambda: {"data", "results"})

    @property
    def label(self) -> str:
        return f"{self.container_name}/{self.blob_name}"

    def get_into(self, view: memoryview, offset: int, etag: str | None) -> Range:
        """`shared.blobio.stream.Ranges` over the store: the statuses as the HTTP reader maps them."""
        self.calls.append((offset, len(view), etag))
        if offset in self.fail_at:
            raise self.fail_at.pop(offset)
        if self.container_name not in self.containers:
            raise InputMissing(f"input {self.label} does not exist (container not found)")
        key = (self.container_name, self.blob_name)
        if key not in self.store:
            raise InputMissing(f"input {self.label} does not exist (blob not found)")
        data = self.store[key]
        chunk = data[offset : offset + len(view)]
        view[: len(chunk)] = chunk
        return Range(len(chunk), len(data), '"etag-1"')

    def upload_blob(self, data: bytes, overwrite: bool = False, **kwargs: Any) -> None:
        assert overwrite
        self.store[(self.container_name, self.blob_name)] = data
        self.uploads.append(kwargs)


@dataclass
class FakeService:
    store: dict[tuple[str, str], bytes] = field(default_factory=dict)
    blobs: list[FakeBlob] = field(default_factory=list)

    def get_blob_client(self, container: str, blob: str) -> FakeBlob:
        client = FakeBlob(container, blob, self.store)
        self.blobs.append(client)
        return client


@dataclass
class FakeContainer:
    """Just enough of the `Blobs` port: ranged reads and uploads, through the service's blobs."""

    name: str
    service: FakeService

    def ranges(self, name: str) -> FakeBlob:
        return self.service.get_blob_client(self.name, name)

    def write(
        self, name: str, data: bytes | str, *, content_type: str | None = None, overwrite: bool = True
    ) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self.service.get_blob_client(self.name, name).upload_blob(
            raw, overwrite=overwrite, content_type=content_type
        )


@dataclass
class FakeStorage:
    """Just enough of the `Account` port: the blobs of a container."""

    blob: FakeService

    def blobs(self, container: str) -> FakeContainer:
        return FakeContainer(container, self.blob)


def make_settings(backend: str = "none", threshold: int = 1000) -> Settings:
    return Settings(
        storage=StorageConnection(connection_string="UseDevelopmentStorage=true"),
        spark=SparkSettings(backend=backend, offload_threshold_bytes=threshold),
    )


def make_ctx(payload: dict[str, Any], service: FakeService, settings: Settings | None = None) -> JobContext:
    saved: list[Any] = []
    return JobContext(
        job_id="job-1",
        kind="aggregate",
        attempt=1,
        payload=payload,
        settings=settings or make_settings(),
        storage=FakeStorage(service),  # type: ignore[arg-type]
        log=logging.LoggerAdapter(logging.getLogger("test"), {}),
        checkpoint=saved.append,
    )


PAYLOAD = {
    "input": "data/sales.csv",
    "format": "csv",
    "group_by": ["k"],
    "metrics": [{"op": "count"}, {"op": "sum", "column": "v"}],
}


# --- choose_engine and result_document ---------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "backend", "size", "expected"),
    [
        ("auto", "none", 10**12, "inline"),
        ("auto", "standalone", 1000, "inline"),
        ("auto", "standalone", 1001, "spark"),
        ("auto", "livy", None, "inline"),
        ("inline", "standalone", 10**12, "inline"),
        ("spark", "none", 1, "spark"),
    ],
)
def test_choose_engine(engine: str, backend: str, size: int | None, expected: str) -> None:
    spec = parse_aggregate_payload({**PAYLOAD, "engine": engine})
    assert choose_engine(spec, size, make_settings(backend, threshold=1000)) == expected


def test_result_document_shape() -> None:
    result = AggregateResult(rows=[{"k": "a", "count": 2}], input_rows=2)
    assert result_document("j1", result, "inline", 0.12345) == {
        "id": "j1",
        "rows": [{"k": "a", "count": 2}],
        "input_rows": 2,
        "engine": "inline",
        "elapsed_s": 0.123,
    }


# --- the handler -------------------------------------------------------------------------------


def test_run_writes_the_result_document() -> None:
    service = FakeService({("data", "sales.csv"): b"k,v\na,1\nb,2\na,\n"})
    outcome = HANDLER.run(make_ctx(PAYLOAD, service))
    assert outcome == Completed(
        result_ref="results/job-1.json", summary={"input_rows": 3, "groups": 2, "engine": "inline"}
    )
    document = json.loads(service.store[("results", "job-1.json")])
    assert document["id"] == "job-1" and document["engine"] == "inline" and document["input_rows"] == 3
    assert document["rows"] == [{"k": "a", "count": 2, "sum_v": 1.0}, {"k": "b", "count": 1, "sum_v": 2.0}]
    assert isinstance(document["elapsed_s"], float)
    upload = service.blobs[-1].uploads[0]
    assert upload["content_type"].startswith("application/json")
    assert len(service.blobs[0].calls) == 1  # a small input is one GET


def test_run_again_overwrites_the_same_blob() -> None:
    service = FakeService({("data", "sales.csv"): b"k,v\na,1\n"})
    first = HANDLER.run(make_ctx(PAYLOAD, service))
    second = HANDLER.run(make_ctx(PAYLOAD, service))
    assert first == second
    assert [k for k in service.store if k[0] == "results"] == [("results", "job-1.json")]


def test_spark_without_backend_is_not_available() -> None:
    service = FakeService()
    with pytest.raises(NotAvailable, match=r"^engine 'spark' is not available: SPARK_BACKEND=none$"):
        HANDLER.run(make_ctx({**PAYLOAD, "engine": "spark"}, service))
    assert service.blobs == []  # refused before any storage request


def test_auto_over_threshold_is_offloaded_to_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    import shared.jobs.offload.aggregate_spark
    from shared.jobs.base import Continue

    calls: list[str] = []
    monkeypatch.setattr(
        shared.jobs.offload.aggregate_spark,
        "offload",
        lambda ctx, spec, reason: recorded(calls, f"offload:{reason}", Continue({}, 3)),
    )
    monkeypatch.setattr(
        shared.jobs.offload.aggregate_spark,
        "resume",
        lambda ctx, spec: recorded(calls, "resume", Continue({}, 3)),
    )
    service = FakeService({("data", "sales.csv"): b"k,v\n" + b"a,1\n" * 100})
    settings = make_settings("standalone", threshold=100)
    assert isinstance(HANDLER.run(make_ctx(PAYLOAD, service, settings)), Continue)
    small = make_settings("standalone", threshold=10_000)
    assert not isinstance(HANDLER.run(make_ctx(PAYLOAD, service, small)), Continue)  # under it: inline
    resumed = make_ctx(PAYLOAD, service, settings)
    resumed.resume_state = {"submission_id": "driver-1"}
    HANDLER.run(resumed)
    assert calls == ["offload:size", "resume"]


def test_missing_blob_and_container_are_input_missing() -> None:
    with pytest.raises(InputMissing, match=r"input data/sales.csv does not exist \(blob not found\)"):
        HANDLER.run(make_ctx(PAYLOAD, FakeService()))
    with pytest.raises(InputMissing, match=r"input nope/sales.csv does not exist \(container not found\)"):
        HANDLER.run(make_ctx({**PAYLOAD, "input": "nope/sales.csv"}, FakeService()))


def test_bad_payload_is_refused_by_run() -> None:
    from shared.core.errors import PayloadError

    with pytest.raises(PayloadError):
        HANDLER.run(make_ctx({**PAYLOAD, "metrics": []}, FakeService()))


# --- the blob stream ---------------------------------------------------------------------------


def blob_with(data: bytes) -> FakeBlob:
    return FakeBlob("data", "big.csv", {("data", "big.csv"): data})


def test_stream_reads_in_ranges_with_read_ahead() -> None:
    data = bytes(range(256)) * 40
    blob = blob_with(data)
    with open_blob_stream(blob, chunk_size=1000, max_concurrency=3) as stream:
        assert stream.size == len(data)
        assert stream.read() == data
    offsets = sorted(c[0] for c in blob.calls)
    assert offsets == list(range(0, len(data), 1000))
    assert all(etag == '"etag-1"' for _, _, etag in blob.calls[1:])  # pinned to the first version


def read_exactly(stream: io.RawIOBase, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = stream.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def test_stream_seek_restarts_the_read_ahead() -> None:
    data = b"0123456789" * 500
    with open_blob_stream(blob_with(data), chunk_size=64, max_concurrency=2) as stream:
        assert read_exactly(stream, 100) == data[:100]  # raw reads may be short
        assert stream.tell() == 100
        stream.seek(4000)
        assert read_exactly(stream, 10) == data[4000:4010]
        stream.seek(0)
        assert stream.read() == data


def test_empty_blob() -> None:
    with open_blob_stream(blob_with(b"")) as stream:
        assert stream.size == 0 and stream.read() == b""


@pytest.mark.parametrize("error", [StorageThrottled("busy"), BlobChanged("changed"), InputMissing("gone")])
def test_storage_failures_mid_stream_reach_the_job(error: Exception) -> None:
    blob = blob_with(b"x" * 5000)
    blob.fail_at[2000] = error
    with (
        pytest.raises(type(error)),
        open_blob_stream(blob, chunk_size=1000, max_concurrency=2) as stream,
    ):
        stream.read()


def test_buffers_are_reused_whatever_the_size() -> None:
    with open_blob_stream(blob_with(b"y" * 100_000), chunk_size=1000, max_concurrency=3) as stream:
        assert stream.read() == b"y" * 100_000
        assert stream.buffers_allocated <= 4  # depth + 1, not size / chunk


def test_stream_is_a_readable_binary_file() -> None:
    with open_blob_stream(blob_with(b"a\nb\n")) as stream:
        assert stream.readable() and stream.seekable()
        assert io.BufferedReader(stream).readline() == b"a\n"


# --- least privilege and the group cap ---------------------------------------------------------


@pytest.mark.parametrize("container", ["ledger", "results", "payloads", "poison-archive"])
def test_an_internal_input_is_refused_before_any_request(container: str) -> None:
    from shared.core.errors import InputRefused

    service = FakeService({(container, "x.csv"): b"k,v\nsecret,1\n"})
    with pytest.raises(InputRefused, match=rf"^payload.input: container '{container}' is this app's "):
        HANDLER.run(make_ctx({**PAYLOAD, "input": f"{container}/x.csv"}, service))
    assert service.blobs == []


def test_input_containers_narrow_what_the_handler_reads() -> None:
    from dataclasses import replace

    from shared.core.errors import InputRefused

    service = FakeService({("data", "sales.csv"): b"k,v\na,1\n", ("other", "x.csv"): b"k,v\na,1\n"})
    settings = replace(make_settings(), input_containers=("data",))
    assert isinstance(HANDLER.run(make_ctx(PAYLOAD, service, settings)), Completed)
    with pytest.raises(InputRefused, match="is not in INPUT_CONTAINERS"):
        HANDLER.run(make_ctx({**PAYLOAD, "input": "other/x.csv"}, service, settings))


MANY = b"k,v\n" + b"".join(b"key%d,1\n" % i for i in range(4))


def test_over_max_groups_without_spark_is_a_permanent_error() -> None:
    from dataclasses import replace

    from shared.core.errors import LimitExceeded

    service = FakeService({("data", "sales.csv"): MANY})
    settings = replace(make_settings(), max_groups=3)
    with pytest.raises(LimitExceeded) as info:
        HANDLER.run(make_ctx(PAYLOAD, service, settings))
    assert str(info.value) == (
        "the input has more than MAX_GROUPS=3 groups (group_by: k; 4 found before stopping): "
        "narrow group_by, raise MAX_GROUPS, or configure a Spark backend (SPARK_BACKEND) and use engine 'auto'"
    )
    assert not [k for k in service.store if k[0] == "results"]  # no result written
    exact = replace(make_settings(), max_groups=4)
    assert HANDLER.run(make_ctx(PAYLOAD, service, exact)).summary["groups"] == 4  # type: ignore[union-attr]


def test_over_max_groups_goes_to_spark_when_it_may(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    import shared.jobs.offload.aggregate_spark
    from shared.core.errors import LimitExceeded
    from shared.jobs.base import Continue

    calls: list[str] = []
    monkeypatch.setattr(
        shared.jobs.offload.aggregate_spark,
        "offload",
        lambda ctx, spec, reason: recorded(calls, reason, Continue({"reason": reason}, 3)),
    )
    service = FakeService({("data", "sales.csv"): MANY})
    settings = replace(make_settings("standalone", threshold=10**9), max_groups=3)
    outcome = HANDLER.run(make_ctx(PAYLOAD, service, settings))
    assert isinstance(outcome, Continue) and calls == ["max_groups"]
    with pytest.raises(LimitExceeded, match=r"MAX_GROUPS=3 .*use engine 'auto' or 'spark'"):
        HANDLER.run(make_ctx({**PAYLOAD, "engine": "inline"}, service, settings))
    assert calls == ["max_groups"]
