"""The blob reader's HTTP edge with a local fake server: retries, error classes, bearer tokens."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from shared.blobio.buffers import BufferPool
from shared.blobio.reader import Bearer, BlobAccessDenied, BlobReader, UnexpectedResponse
from shared.blobio.stream import START_DEPTH, BlobStream, Range
from shared.core.errors import InputMissing, StorageThrottled

DATA = bytes(range(256)) * 8


class Handler(BaseHTTPRequestHandler):
    answers: list[int] = []  # statuses to give before serving the range
    seen: list[dict[str, str]] = []
    hang_up = False  # close each connection after its answer, without saying so (idle timeout)
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        Handler.seen.append(dict(self.headers))
        status = Handler.answers.pop(0) if Handler.answers else 206
        if status == 1:  # whole headers, then the connection dropped mid-body
            first, last = (int(x) for x in self.headers["x-ms-range"].split("=")[1].split("-"))
            body = DATA[first : last + 1]
            self.send_response(206)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Range", f"bytes {first}-{first + len(body) - 1}/{len(DATA)}")
            self.send_header("ETag", '"v1"')
            self.end_headers()
            self.wfile.write(body[:10])
            self.close_connection = True
            return
        if status == 0:  # drop the connection mid-answer
            self.send_response(206)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"short")
            self.close_connection = True
            return
        if status != 206:
            self.send_response(status)
            self.send_header("x-ms-error-code", "Code")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        first, last = (int(x) for x in self.headers["x-ms-range"].split("=")[1].split("-"))
        body = DATA[first : last + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Range", f"bytes {first}-{first + len(body) - 1}/{len(DATA)}")
        self.send_header("ETag", '"v1"')
        self.end_headers()
        self.wfile.write(body)
        if Handler.hang_up:
            self.close_connection = True


@pytest.fixture
def server() -> Iterator[str]:
    Handler.answers, Handler.seen, Handler.hang_up = [], [], False
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/acct"
    httpd.shutdown()
    httpd.server_close()


@dataclass
class FakeToken:
    token: str
    expires_on: int


class FakeCredential:
    def __init__(self, expires_on: int) -> None:
        self.calls = 0
        self.expires_on = expires_on

    def get_token(self, *scopes: str, **kwargs: Any) -> FakeToken:
        assert scopes == ("https://storage.azure.com/.default",)
        self.calls += 1
        return FakeToken(f"t{self.calls}", self.expires_on)


def reader(url: str, credential: FakeCredential | None = None) -> BlobReader:
    cred = credential or FakeCredential(expires_on=2**40)
    return BlobReader(url, Bearer(cred), chunk_size=300, depth=2, sleep=lambda s: None)


def test_5xx_429_and_broken_connections_are_retried(server: str) -> None:
    Handler.answers = [503, 0, 429]
    with reader(server).open("data", "x.bin") as stream:
        assert stream.read() == DATA


def test_a_first_get_retried_after_its_headers_reads_under_their_etag(server: str) -> None:
    Handler.answers = [1]  # the stream went on at the headers: a retry must read that version
    with reader(server).open("data", "x.bin") as stream:
        assert stream.read() == DATA
    first_gets = [h for h in Handler.seen if h["x-ms-range"].startswith("bytes=0-")]
    assert [h.get("If-Match") for h in first_gets] == [None, '"v1"']
    assert all(h.get("If-Match") == '"v1"' for h in Handler.seen[1:])


def test_a_blob_of_at_most_a_chunk_is_one_get(server: str) -> None:
    big = BlobReader(server, Bearer(FakeCredential(expires_on=2**40)), chunk_size=4096, depth=2)
    with big.open("data", "x.bin") as stream:
        assert stream.read() == DATA
    assert [h["x-ms-range"] for h in Handler.seen] == ["bytes=0-4095"]


def test_persistent_5xx_is_storage_throttled(server: str) -> None:
    Handler.answers = [500] * 4
    with pytest.raises(StorageThrottled, match=r"storage busy reading data/x\.bin: 500 Code"):
        reader(server).open("data", "x.bin")


def test_403_is_access_denied_and_other_statuses_are_unexpected(server: str) -> None:
    Handler.answers = [403]
    with pytest.raises(BlobAccessDenied, match="403 Code"):
        reader(server).open("data", "x.bin")
    Handler.answers = [400]
    with pytest.raises(UnexpectedResponse, match="400 Code"):
        reader(server).open("data", "x.bin")


def test_bearer_token_is_sent_reused_and_renewed(server: str) -> None:
    lasting = FakeCredential(expires_on=2**40)
    with reader(server, lasting).open("data", "dir/x y.bin") as stream:
        assert stream.read() == DATA
    assert lasting.calls == 1
    assert {h["Authorization"] for h in Handler.seen} == {"Bearer t1"}
    assert all(h["If-Match"] == '"v1"' for h in Handler.seen[1:]) and "If-Match" not in Handler.seen[0]
    ending = FakeCredential(expires_on=0)  # always within the renewal margin
    reader(server, ending).read_range("data", "x.bin", 0, 10)
    reader(server, ending).read_range("data", "x.bin", 0, 10)
    assert ending.calls == 2


def test_connections_the_server_closed_while_idle_are_replaced_without_a_retry(server: str) -> None:
    Handler.hang_up = True
    cred = FakeCredential(expires_on=2**40)
    kept = BlobReader(server, Bearer(cred), chunk_size=300, depth=2, retries=0, sleep=lambda s: None)
    for _ in range(3):
        assert kept.read_range("data", "x.bin", 0, 10) == DATA[:10]
    assert len(Handler.seen) == 3


def test_connections_idle_too_long_are_not_reused(server: str) -> None:
    cred = FakeCredential(expires_on=2**40)
    kept = BlobReader(server, Bearer(cred), chunk_size=300, depth=2, sleep=lambda s: None)
    kept.read_range("data", "x.bin", 0, 10)
    conn, reused = kept.connections.get()
    assert reused
    kept.connections.put(conn)
    kept.connections.idle_s = -1.0
    assert kept.connections.get()[1] is False


@dataclass
class MemoryRanges:
    """`Ranges` over bytes in memory (the stream's only I/O)."""

    data: bytes
    label: str = "mem/x"

    def get_into(self, view: memoryview, offset: int, etag: str | None) -> Range:
        piece = self.data[offset : offset + len(view)]
        view[: len(piece)] = piece
        return Range(len(piece), len(self.data), '"e"')


class HeraldRanges(MemoryRanges):
    """`AnnouncingRanges` in memory: each GET's Range announced before its body, and the first
    body held back until a GET ahead has started (so the stream must go on at the headers)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.ahead = threading.Event()
        self.gets: list[tuple[int, str | None]] = []

    def get_into(self, view: memoryview, offset: int, etag: str | None) -> Range:
        self.gets.append((offset, etag))
        self.ahead.set()
        return super().get_into(view, offset, etag)

    def get_into_announced(
        self, view: memoryview, offset: int, etag: str | None, announce: Callable[[Range], None]
    ) -> Range:
        self.gets.append((offset, etag))
        if not self.data:
            return Range(0, 0, '"e"')  # an empty blob: a 416, nothing announced
        announce(Range(min(len(view), len(self.data) - offset), len(self.data), '"e"'))
        if len(self.data) > len(view):
            assert self.ahead.wait(10)
        return super().get_into(view, offset, etag)


def test_the_gets_ahead_start_at_the_first_gets_headers() -> None:
    data = bytes(range(256)) * 40
    ranges = HeraldRanges(data)
    with BlobStream(ranges, chunk_size=1000, depth=3, lend=2) as s:
        assert s.size == len(data) and s.etag == '"e"'
        assert s.read() == data
    offsets = sorted(offset for offset, _ in ranges.gets)
    assert offsets == list(range(0, len(data), 1000))  # a whole chunk first: no GET of its own
    assert ranges.gets[0] == (0, None)
    assert all(etag == '"e"' for _, etag in ranges.gets[1:])


class CountingRanges(HeraldRanges):
    """Counts the GETs in flight (started, not ended) and the most seen at once."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.ahead.set()
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.started = 0

    def get_into_announced(
        self, view: memoryview, offset: int, etag: str | None, announce: Callable[[Range], None]
    ) -> Range:
        self._begin()
        try:
            return super().get_into_announced(view, offset, etag, announce)
        finally:
            self._end()

    def get_into(self, view: memoryview, offset: int, etag: str | None) -> Range:
        self._begin()
        try:
            threading.Event().wait(0.02)  # long enough for the stream to start every GET it may
            return super().get_into(view, offset, etag)
        finally:
            self._end()

    def _begin(self) -> None:
        with self.lock:
            self.now += 1
            self.started += 1
            self.most = max(self.most, self.now)

    def _end(self) -> None:
        with self.lock:
            self.now -= 1


def test_a_stream_starts_with_two_gets_in_flight_and_grows_to_its_depth() -> None:
    data = bytes(range(256)) * 100
    ranges = CountingRanges(data)
    with BlobStream(ranges, chunk_size=1000, depth=5, lend=2) as s:
        threading.Event().wait(0.1)  # time for any GET the stream scheduled to start
        assert ranges.started == START_DEPTH  # the first GET and one ahead, until a range is taken
        out = bytearray()
        while (got := s.next_chunk()) is not None:
            out += got[0][got[1] : got[2]]
            s.give_back(got[0])
        assert bytes(out) == data
    assert ranges.most == 5  # all of the depth once ranges were taken, never more


def test_an_announcing_first_get_of_a_small_empty_or_missing_blob() -> None:
    pool = BufferPool(1000, keep=4, timer=FakeTimer)
    small = HeraldRanges(b"x" * 700)
    with BlobStream(small, chunk_size=1000, depth=3, pool=pool) as s:
        assert s.read() == b"x" * 700
    assert small.gets == [(0, None)]  # one GET for a blob of at most a chunk
    with BlobStream(HeraldRanges(b""), chunk_size=1000, depth=3, pool=pool) as s:
        assert s.size == 0 and s.read() == b""
    kept = pool.kept
    missing = HeraldRanges(b"x")
    missing.data = b""
    missing.get_into_announced = _missing  # type: ignore[method-assign]
    with pytest.raises(InputMissing, match="does not exist"):
        BlobStream(missing, chunk_size=1000, depth=3, pool=pool)
    assert pool.kept == kept  # its buffer went back


def _missing(view: memoryview, offset: int, etag: str | None, announce: Callable[[Range], None]) -> Range:
    raise InputMissing("input mem/x does not exist (blob not found)")


def test_chunks_are_handed_over_without_a_copy_and_memory_stays_bounded() -> None:
    data = bytes(range(256)) * 1000
    with BlobStream(MemoryRanges(data), chunk_size=1000, depth=3, lend=2, first_size=100) as s:
        out, held = bytearray(), []
        while (got := s.next_chunk()) is not None:
            buf, start, end = got
            out += buf[start:end]
            held.append(buf)
            if len(held) == 2:  # the caller holds two at a time, as the engine's blocks do
                s.give_back(held.pop(0))
        assert bytes(out) == data
        assert s.buffers_allocated <= 3 + 1 + 2


def test_a_caller_holding_every_buffer_is_told_not_given_a_short_read() -> None:
    with BlobStream(MemoryRanges(b"x" * 10_000), chunk_size=1000, depth=1, lend=1) as s:
        held = [s.next_chunk(), s.next_chunk(), s.next_chunk()]
        assert all(held)
        with pytest.raises(RuntimeError, match="every buffer is lent out"):
            s.next_chunk()


def test_seek_after_handing_over_reads_again_from_there() -> None:
    data = bytes(range(256)) * 40
    with BlobStream(MemoryRanges(data), chunk_size=1000, depth=2, lend=1) as s:
        s.next_chunk()
        s.next_chunk()
        s.seek(5)
        assert s.read() == data[5:]


class FakeTimer:
    """threading.Timer's shape, started by hand: the pool's idle timer without waiting."""

    made: list[FakeTimer] = []

    def __init__(self, interval: float, action: Any) -> None:
        self.interval, self.action, self.cancelled, self.daemon = interval, action, False, False
        FakeTimer.made.append(self)

    def start(self) -> None:
        pass

    def cancel(self) -> None:
        self.cancelled = True


def test_a_closed_streams_buffers_serve_the_next_stream() -> None:
    pool = BufferPool(1000, keep=6, timer=FakeTimer)
    data = bytes(range(256)) * 40
    for _ in range(3):
        with BlobStream(MemoryRanges(data), chunk_size=1000, depth=3, lend=2, pool=pool) as s:
            out = bytearray()
            while (got := s.next_chunk()) is not None:
                out += got[0][got[1] : got[2]]
                s.give_back(got[0])
            assert bytes(out) == data
    assert 0 < pool.created <= 6  # the first stream's; the next two took them from the pool
    assert pool.kept == pool.created


class BlockedRanges(MemoryRanges):
    """GETs after the first wait until `go` is set (GETs still writing when the stream closes)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.go = threading.Event()
        self.views: list[memoryview] = []

    def get_into(self, view: memoryview, offset: int, etag: str | None) -> Range:
        if offset:
            self.views.append(view)
            assert self.go.wait(10)
        return super().get_into(view, offset, etag)


def test_buffers_a_get_may_still_write_or_a_caller_holds_are_not_kept() -> None:
    pool = BufferPool(1000, keep=10, timer=FakeTimer)
    ranges = BlockedRanges(b"y" * 1000 + b"z" * 9000)
    s = BlobStream(ranges, chunk_size=1000, depth=3, lend=2, first_size=1000, pool=pool)
    held = s.next_chunk()  # the first GET's buffer, lent out and not given back
    assert held is not None
    for _ in range(100):  # the three GETs ahead are running (blocked), their buffers busy
        if len(ranges.views) == 3:
            break
        threading.Event().wait(0.05)
    assert len(ranges.views) == 3
    s.close()
    busy = {id(v.obj) for v in ranges.views} | {id(held[0])}
    ranges.go.set()
    assert pool.kept == 0  # every buffer was busy or lent
    assert all(id(pool.take()) not in busy for _ in range(4))


def test_kept_buffers_are_freed_after_the_idle_time() -> None:
    FakeTimer.made = []
    pool = BufferPool(1000, keep=4, idle_s=60.0, timer=FakeTimer)
    with BlobStream(MemoryRanges(b"x" * 5000), chunk_size=1000, depth=2, pool=pool) as s:
        assert s.read() == b"x" * 5000
    assert pool.kept == 3 and FakeTimer.made[-1].interval == 60.0 and FakeTimer.made[-1].daemon
    with BlobStream(MemoryRanges(b"x" * 5000), chunk_size=1000, depth=2, pool=pool) as s:
        s.read()
    assert FakeTimer.made[-2].cancelled  # a stream closed again: the idle time starts over
    FakeTimer.made[-2].action()  # the cancelled timer fires anyway (it was already running)
    assert pool.kept == 3
    FakeTimer.made[-1].action()
    assert pool.kept == 0
