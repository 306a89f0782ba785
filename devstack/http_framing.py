"""HTTP/1.1 message framing for the fault proxy: read a head, copy a body as framed, build an answer.

Bytes are copied as they are on the wire (chunk sizes and trailers included), so what is
forwarded is what was sent.
"""

from __future__ import annotations

import http
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass

CHUNKED = -1
"""Body length marker: `Transfer-Encoding: chunked`."""
MAX_HEAD = 64 * 1024
BLOCK = 64 * 1024

Sink = Callable[[bytes], object]


class Broken(Exception):
    """A connection ended or sent something unparseable mid-message."""


@dataclass
class Head:
    """A message head as received: the raw bytes, the start line's parts, and the headers."""

    raw: bytes
    start: list[str]
    headers: dict[str, str]
    """Lower-case name -> value (repeated headers joined with ", ")."""

    def keep_alive(self) -> bool:
        version = self.start[0] if self.start[0].startswith("HTTP/") else self.start[-1]
        return "close" not in self.headers.get("connection", "").lower() and version != "HTTP/1.0"


def read_head(rfile: io.BufferedIOBase) -> Head | None:
    """The next message head, or None when the connection closed cleanly before it."""
    raw = bytearray()
    lines: list[bytes] = []
    while True:
        line = rfile.readline(MAX_HEAD)
        if not line:
            if not raw:
                return None
            raise Broken("connection closed inside a message head")
        raw += line
        if len(raw) >= MAX_HEAD:
            raise Broken("message head too large")
        if line in (b"\r\n", b"\n"):
            break
        lines.append(line)
    if not lines:
        raise Broken("empty message head")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise Broken("malformed header line")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    start = lines[0].decode("latin-1").rstrip("\r\n").split(" ", 2)
    return Head(bytes(raw), start, headers)


def body_length(head: Head, no_body: bool = False) -> int | None:
    """Body bytes to copy, CHUNKED, or None for "until the connection closes"."""
    if no_body:
        return 0
    if "transfer-encoding" in head.headers:
        if head.headers["transfer-encoding"].lower().replace(" ", "").endswith("chunked"):
            return CHUNKED
        return None
    try:
        return int(head.headers.get("content-length", "0").split(",")[0])
    except ValueError as exc:
        raise Broken("bad Content-Length") from exc


def read_line(rfile: io.BufferedIOBase) -> bytes:
    line = rfile.readline(MAX_HEAD)
    if not line.endswith(b"\n"):
        raise Broken("connection closed inside a chunked body")
    return line


def copy_exact(rfile: io.BufferedIOBase, length: int, sink: Sink) -> None:
    while length > 0:
        data = rfile.read1(min(length, BLOCK))
        if not data:
            raise Broken("connection closed inside a body")
        sink(data)
        length -= len(data)


def copy_body(rfile: io.BufferedIOBase, length: int | None, sink: Sink) -> None:
    """Copy one body as framed on the wire (chunk sizes and trailers included)."""
    if length is None:
        while data := rfile.read1(BLOCK):
            sink(data)
    elif length != CHUNKED:
        copy_exact(rfile, length, sink)
    else:
        while True:
            line = read_line(rfile)
            sink(line)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError as exc:
                raise Broken("bad chunk size") from exc
            if size == 0:
                break
            copy_exact(rfile, size, sink)
            sink(read_line(rfile))
        while (trailer := read_line(rfile)) not in (b"\r\n", b"\n"):
            sink(trailer)
        sink(trailer)


def discard(_: bytes) -> None:
    return None


def response(status: int, body: bytes, headers: Mapping[str, str], keep_alive: bool) -> bytes:
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Fault"
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers.items())]
    lines += [f"Content-Length: {len(body)}", f"Connection: {'keep-alive' if keep_alive else 'close'}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
