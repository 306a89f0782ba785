"""The engine over a stream that hands over its own buffers (`next_chunk` / `give_back`, as the
blob reader does): the same answers and errors as over a plain stream, whatever the buffer and
block sizes; every buffer given back; only a bounded number out at once."""

from __future__ import annotations

import io
import random
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from devstack import datagen
from shared.aggregation import (
    NATIVE,
    AggregateSpec,
    EngineOptions,
    aggregate_stream,
    blocks,
    csv_path,
    options,
    parse_aggregate_payload,
)
from shared.core.errors import InputDataError
from tests.conftest import FAST_TIER


@pytest.fixture(autouse=True, params=["scanner", "python"])
def scanner(request: pytest.FixtureRequest) -> Iterator[None]:
    global TUNING
    TUNING = EngineOptions(native=request.param == "scanner")
    yield
    TUNING = EngineOptions()


TUNING = EngineOptions()
"""The engine's options in the running test: the scanner on or off (the `scanner` fixture)."""


class ChunkStream(io.RawIOBase):
    """Bytes handed out in buffers of `chunk` bytes (the first `first`), each a fresh bytearray
    with junk around the range; `seek`/`read` for the error path's line count."""

    def __init__(self, data: bytes, chunk: int, first: int | None = None) -> None:
        super().__init__()
        self.data, self.chunk, self.first = data, chunk, first or chunk
        self.pos = 0
        self.out: dict[int, bytearray] = {}
        self.most_out = 0

    def next_chunk(self) -> tuple[bytearray, int, int] | None:
        if self.pos >= len(self.data):
            return None
        size = self.first if self.pos == 0 else self.chunk
        piece = self.data[self.pos : self.pos + size]
        self.pos += len(piece)
        buf = bytearray(b'\n"junk' + piece + b'"\n')
        self.out[id(buf)] = buf
        self.most_out = max(self.most_out, len(self.out))
        return buf, 6, 6 + len(piece)

    def give_back(self, buf: bytearray) -> None:
        assert self.out.pop(id(buf)) is buf
        buf[:] = b"x" * len(buf)  # reused by the reader: a block still parsed would see this

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = offset
        self.out.clear()
        return offset

    def readinto(self, buffer: Any) -> int:
        piece = self.data[self.pos : self.pos + len(buffer)]
        buffer[: len(piece)] = piece
        self.pos += len(piece)
        return len(piece)


METRICS = [
    {"op": "count", "as": "n"},
    {"op": "count", "column": "v", "as": "nv"},
    {"op": "sum", "column": "v", "as": "s"},
    {"op": "min", "column": "v", "as": "lo"},
    {"op": "max", "column": "v", "as": "hi"},
]


def spec(fmt: str, group_by: list[str], metrics: list[dict[str, str]] | None = None) -> AggregateSpec:
    return parse_aggregate_payload(
        {"input": "c1c/x", "format": fmt, "group_by": group_by, "metrics": metrics or METRICS}
    )


def outcome(stream: Any, s: AggregateSpec, block_size: int, speculative: bool = True) -> Any:
    tuning = replace(TUNING, block_size=block_size, speculative_cuts=speculative)
    try:
        result = aggregate_stream(stream, s, options=tuning)
    except InputDataError as exc:
        return ("error", str(exc))
    rows = [{k: float(f"{v:.12g}") if isinstance(v, float) else v for k, v in r.items()} for r in result.rows]
    return (rows, result.input_rows)  # sums in another order: equal to 12 digits


def same_as_plain(data: bytes, s: AggregateSpec, chunks: tuple[int, ...], blocks: tuple[int, ...]) -> None:
    """The same answer or error over handed-over buffers of every size as over a plain stream,
    and as over a plain stream cut by `record_cut` alone (no speculative cut)."""
    for block_size in blocks:
        expected = outcome(io.BytesIO(data), s, block_size, speculative=False)
        assert outcome(io.BytesIO(data), s, block_size) == expected, block_size
        for chunk in chunks:
            for first in (None, 7):
                stream = ChunkStream(data, chunk, first)
                assert outcome(stream, s, block_size) == expected, (chunk, first, block_size)
                if expected[0] != "error":
                    assert not stream.out, "every buffer is given back"


def tricky_csv(rows: int, seed: int) -> bytes:
    rnd = random.Random(seed)
    lines = ["k,v,note"]
    for _ in range(rows):
        note = rnd.choice(["", "plain", '"a, b"', '"two\nlines"', '"say ""hi"""', '"\r\n"'])
        v = rnd.choice(["1", "2.5", "", "NA", "-3e2", " 4 "])
        lines.append(f"{rnd.choice(['a', 'b', 'ü', ''])},{v},{note}")
    return ("\n".join(lines) + rnd.choice(["", "\n"])).encode()


@pytest.mark.parametrize("seed", range(1 if FAST_TIER else 4))  # the fast tier: one seed
def test_csv_with_quoted_line_breaks_at_every_seam(seed: int) -> None:
    data = tricky_csv(300, seed)
    same_as_plain(data, spec("csv", ["k"]), chunks=(1, 5, 64, 333, 1 << 20), blocks=(16, 100, 4096))


def test_crlf_bom_and_a_header_longer_than_the_buffers() -> None:
    long_header = ",".join(f"c{i}" for i in range(300)) + ",k,v"
    row = ",".join("1" for _ in range(300))
    for text in (
        "\ufeffk,v\r\na,1\r\nb,2\r\na,3",
        f"{long_header}\n{row},a,1\n{row},b,2\n",
        "k,v\r",
        "k,v\n",
    ):
        same_as_plain(text.encode(), spec("csv", ["k"]), chunks=(1, 2, 3, 100, 4096), blocks=(16, 4096))


def test_generated_sales_csv_and_jsonl(tmp_path: Any) -> None:
    for fmt in ("csv", "jsonl"):
        path = tmp_path / f"sales.{fmt}"
        datagen.write(path, rows=3000, fmt=fmt)
        metrics = [{"op": "count"}, {"op": "mean", "column": "price"}, {"op": "max", "column": "qty"}]
        s = spec(fmt, ["region"], metrics)
        same_as_plain(path.read_bytes(), s, chunks=(999, 64 * 1024), blocks=(4096, 1 << 20))


def test_jsonl_seams_and_blank_lines() -> None:
    lines = [f'{{"k": "{k}", "v": {v}}}' for k, v in zip("abcab" * 40, range(200), strict=True)]
    text = "\n".join(lines[:50]) + "\n\n" + "\n".join(lines[50:])
    same_as_plain(text.encode(), spec("jsonl", ["k"]), chunks=(1, 17, 1000), blocks=(100, 4096))


def test_errors_name_the_same_line() -> None:
    csv_text = "k,v\n" + "a,1\n" * 500 + 'b,"x\ny"\n' + "c,oops\n" + "a,2\n" * 100
    same_as_plain(csv_text.encode(), spec("csv", ["k"]), chunks=(10, 333), blocks=(64, 4096))
    jsonl = '{"k":"a","v":1}\n' * 300 + '{"k":"a","v":[1]}\n' + '{"k":"a","v":1}\n' * 10
    same_as_plain(jsonl.encode(), spec("jsonl", ["k"]), chunks=(10, 333), blocks=(64, 4096))


def test_a_record_over_the_limit_is_refused() -> None:
    data = b"k,v\n" + b"a" * 5000 + b",1\n"
    tuning = replace(TUNING, block_size=100, max_record_bytes=1000)
    with pytest.raises(InputDataError, match="a CSV record at byte 4 is longer than"):
        aggregate_stream(ChunkStream(data, 100), spec("csv", ["k"]), options=tuning)


def test_buffers_out_at_once_stay_bounded() -> None:
    data = tricky_csv(20_000, 9)
    stream = ChunkStream(data, 4096)
    aggregate_stream(stream, spec("csv", ["k"]), options=replace(TUNING, block_size=2048))
    assert not stream.out
    assert stream.most_out <= options.PARSE_WORKERS + options.IN_FLIGHT_EXTRA + 2


class Recording(ChunkStream):
    """A `ChunkStream` that keeps every buffer it hands out (alive, so no id is used twice)."""

    def __init__(self, data: bytes, chunk: int) -> None:
        super().__init__(data, chunk)
        self.handed: dict[int, int] = {}  # id(buffer) -> bytes of input in it
        self.kept: list[bytearray] = []

    def next_chunk(self) -> tuple[bytearray, int, int] | None:
        got = super().next_chunk()
        if got is not None:
            self.handed[id(got[0])] = got[2] - got[1]
            self.kept.append(got[0])
        return got


@pytest.mark.parametrize(
    ("whole", "chunk", "per_buffer"), [(True, 2000, 1), (True, 3000, 2), (False, 2000, 2), (False, 1400, 1)]
)
def test_a_buffer_up_to_twice_the_block_size_is_one_block(whole: bool, chunk: int, per_buffer: int) -> None:
    """In place, with `whole_buffers` (the C scanner's blocks), a buffer of up to
    WHOLE_BUFFER_BLOCKS block sizes is one block (one hand-off to a parse thread) and a larger one
    is cut at the block size, then its rest is one block; without, the rest is one block under 1.5
    block sizes."""
    assert blocks.WHOLE_BUFFER_BLOCKS == 2
    data = b"".join(b"%09d\n" % i for i in range(3000))  # 10-byte records
    stream = Recording(data, chunk)
    splitter = blocks.InPlaceSplitter(stream, 1000, csv_path.record_cut, "a CSV record", 1 << 20)
    splitter.whole_buffers = whole
    cut_from: dict[int, list[int]] = {}  # id(buffer) -> sizes of the blocks cut in place from it
    seen = bytearray()
    for block in splitter.blocks():
        seen += memoryview(block.buf)[block.start : block.end]
        if id(block.buf) in stream.handed:
            cut_from.setdefault(id(block.buf), []).append(block.end - block.start)
        splitter.release(block.buf)
    splitter.close()
    assert bytes(seen) == data
    full = [sizes for key, sizes in cut_from.items() if stream.handed[key] == chunk]
    assert len(full) >= len(data) // chunk - 1
    assert all(len(sizes) == per_buffer for sizes in full), full
    assert all(size <= (2000 if whole else 1500) for sizes in full for size in sizes)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_scanners_blocks_are_whole_buffers(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine sets `whole_buffers` where the C scanner parses its blocks, and only there; a
    CSV cut again (a block cut inside a quoted line break) keeps it."""
    made: list[blocks.Splitter] = []
    over, cut_again = blocks.Splitter.over, csv_path.cut_again

    def recording_over(*args: Any) -> blocks.Splitter:
        made.append(over(*args))
        return made[-1]

    def recording_cut_again(*args: Any, **kwargs: Any) -> blocks.Splitter:
        made.append(cut_again(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(blocks.Splitter, "over", staticmethod(recording_over))
    monkeypatch.setattr(csv_path, "cut_again", recording_cut_again)
    data = (
        multiline_csv(2000, every=4)
        if fmt == "csv"
        else b"".join(b'{"k": "a", "v": %d}\n' % i for i in range(200))
    )
    aggregate_stream(ChunkStream(data, 1000), spec(fmt, ["k"]), options=TUNING)
    scanner = TUNING.native and NATIVE
    assert len(made) == (2 if fmt == "csv" and scanner else 1)  # the CSV's speculative cut, cut again
    assert [splitter.whole_buffers for splitter in made] == [scanner] * len(made)


class SeekCounting(ChunkStream):
    """A `ChunkStream` that counts its seeks."""

    def __init__(self, data: bytes, chunk: int) -> None:
        super().__init__(data, chunk)
        self.seeks: list[int] = []

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.seeks.append(offset)
        return super().seek(offset, whence)


class SeekCountingFile(io.BytesIO):
    """A plain stream (its blocks copied into the splitter's buffers) that counts its seeks."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.seeks: list[int] = []

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.seeks.append(offset)
        return super().seek(offset, whence)


@pytest.fixture
def recuts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The input offsets the CSV path cuts again from (a block cut inside quotes)."""
    seen: list[int] = []
    cut_again = csv_path.cut_again

    def counted(*args: Any, **kwargs: Any) -> Any:
        pending, unsent = args[3], args[4]
        seen.append(([block for _job, block, _lines in pending] + unsent)[0].offset)
        return cut_again(*args, **kwargs)

    monkeypatch.setattr(csv_path, "cut_again", counted)
    return seen


def multiline_csv(rows: int, every: int) -> bytes:
    """k,v,note with a note over three lines in every `every`-th record."""
    lines = ["k,v,note"]
    for i in range(rows):
        note = '"one\ntwo, ""2""\nthree"' if i % every == every - 1 else "plain"
        lines.append(f"{'abc'[i % 3]},{i % 7},{note}")
    return ("\n".join(lines) + "\n").encode()


def a_record_start(data: bytes, at: int) -> bool:
    return data[at - 1] == 10 and data[:at].count(b'"') % 2 == 0


def test_a_cut_inside_quoted_line_breaks_is_cut_again_once(recuts: list[int]) -> None:
    """A block cut at its last line break, inside a quoted value, is cut again from its start
    (a record boundary) with every block after it, counting quotes: the same answer as counting
    them throughout. Over handed-over buffers nothing is read twice (no seek); over a plain
    stream it seeks back once. Only with the scanner: the Python path's cut always counts."""
    s = spec("csv", ["k"], [{"op": "count"}, {"op": "sum", "column": "v"}])
    data = multiline_csv(2000, every=4)  # dense enough that every block size cuts inside one
    for block_size in (64, 700, 4096):
        expected = outcome(io.BytesIO(data), s, block_size, speculative=False)
        assert expected[0] != "error" and expected[1] == 2000
        for stream in (SeekCounting(data, 1000), SeekCountingFile(data)):
            recuts.clear()
            assert outcome(stream, s, block_size) == expected, (block_size, stream)
            assert len(recuts) == (1 if TUNING.native else 0), recuts
            assert all(a_record_start(data, at) for at in recuts)
            if isinstance(stream, SeekCounting):
                assert stream.seeks == [], "handed-over buffers are cut again from a copy"
                assert not stream.out, "every buffer is given back"
            else:
                assert stream.seeks == recuts  # back to the block, once


def test_no_cut_again_without_line_breaks_in_quotes(recuts: list[int]) -> None:
    """Quoted values with commas and doubled quotes but no line breaks: every cut is right."""
    s = spec("csv", ["k"], [{"op": "count"}, {"op": "sum", "column": "v"}])
    data = "k,v,note\n" + "".join(f'{"ab"[i % 2]},{i},"x, ""y"""\n' for i in range(3000))
    stream = SeekCounting(data.encode(), 1000)
    got = outcome(stream, s, 100)
    assert got == outcome(io.BytesIO(data.encode()), s, 100, speculative=False)
    assert got[1] == 3000 and recuts == [] and stream.seeks == []


def test_a_bad_record_after_a_cut_inside_quotes_names_its_line(recuts: list[int]) -> None:
    s = spec("csv", ["k"], [{"op": "sum", "column": "v"}])
    head = multiline_csv(300, every=7)
    data = head + b"b,oops,x\n" + b"a,1,y\n" * 50
    line = head.count(b"\n") + 1
    for block_size in (64, 4096):
        recuts.clear()
        stream = SeekCounting(data, 333)
        got = outcome(stream, s, block_size)
        assert got == outcome(io.BytesIO(data), s, block_size, speculative=False)
        assert got[0] == "error" and f"on line {line}:" in got[1], got
        assert stream.seeks == [0]  # only to count the lines before the bad record
        assert len(recuts) == (1 if TUNING.native else 0) and all(at < len(head) for at in recuts)


def test_the_blob_stream_is_never_read_twice(recuts: list[int]) -> None:
    """The same over the blob reader's own stream: its GETs go forward only."""
    from shared.blobio.stream import BlobStream, Range

    class Ranges:
        label = "mem/x"

        def __init__(self, data: bytes) -> None:
            self.data = data
            self.offsets: list[int] = []

        def get_into(self, view: memoryview, offset: int, etag: str | None) -> Range:
            self.offsets.append(offset)
            piece = self.data[offset : offset + len(view)]
            view[: len(piece)] = piece
            return Range(len(piece), len(self.data), '"e"')

    s = spec("csv", ["k"], [{"op": "count"}, {"op": "sum", "column": "v"}])
    data = multiline_csv(5000, every=5)
    expected = outcome(io.BytesIO(data), s, 2048, speculative=False)
    ranges = Ranges(data)
    with BlobStream(ranges, chunk_size=8192, depth=3, first_size=1000) as stream:
        assert outcome(stream, s, 2048) == expected
        assert stream.buffers_allocated <= 3 + 1 + 4
    assert ranges.offsets == sorted(set(ranges.offsets)), ranges.offsets  # each range read once
    assert len(recuts) == (1 if TUNING.native else 0) and all(a_record_start(data, at) for at in recuts)


def test_a_cut_inside_quotes_then_a_record_over_the_limit(recuts: list[int]) -> None:
    """The splitter stops on a record over the limit while a block before it was cut inside
    quotes: the stream seeks back to that block (the splitter's state is gone), and the error
    is the one counting quotes throughout gives."""
    s = spec("csv", ["k"], [{"op": "count"}])
    data = b"k,v,note\n" + b"a,1,plain\n" * 50 + b'b,2,"one\ntwo\nthree"\n' + b"a," + b"x" * 5000 + b"\n"
    results = []
    for speculative in (True, False):
        tuning = replace(TUNING, block_size=100, max_record_bytes=1000, speculative_cuts=speculative)
        stream = SeekCounting(data, 130)  # a buffer ends at byte 520, inside the quoted value
        with pytest.raises(InputDataError) as caught:
            aggregate_stream(stream, s, options=tuning)
        results.append(str(caught.value))
        if speculative and TUNING.native:
            assert len(recuts) == 1 and stream.seeks == recuts, (recuts, stream.seeks)
    assert results[0] == results[1] and "is longer than" in results[0], results
