"""The pipe between the host and its worker process, and what an invocation comes back as.

Frames: a 4-byte big-endian length, then a pickle of a tuple. Messages:

- host -> worker: ("invoke", seq, function name, invocation id, payload), payload as in `worker`;
- worker -> host: ("ready", pid, [FunctionSpec.describe(), ...]) once indexed, or
  ("error", "config" | "import", text) and exit; then ("done", seq, result, requests) per call,
  result = ("ok", {queue output name: [body, ...]}, (status, headers, body) | None) or
  ("error", exception type name, message, traceback text); requests = storage requests made in
  the worker since the last frame ({service: {method: n}}), or None.
"""

from __future__ import annotations

import contextlib
import pickle
import struct
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, BinaryIO

HEADER = struct.Struct(">I")

HttpResult = tuple[int, dict[str, str], bytes]


class Channel:
    """Length-prefixed pickles over a pair of binary streams; `send` is thread-safe."""

    def __init__(self, reader: BinaryIO, writer: BinaryIO) -> None:
        self._reader = reader
        self._writer = writer
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._writer.write(HEADER.pack(len(data)) + data)
            self._writer.flush()

    def recv(self) -> tuple[Any, ...]:
        """The next message; EOFError when the other side has gone."""
        header = self._reader.read(HEADER.size)
        if len(header) < HEADER.size:
            raise EOFError("channel closed")
        (size,) = HEADER.unpack(header)
        data = self._reader.read(size)
        if len(data) < size:
            raise EOFError("channel closed mid-frame")
        message = pickle.loads(data)
        if not isinstance(message, tuple):
            raise TypeError(f"unexpected frame of type {type(message).__name__}")
        return message

    def close_writer(self) -> None:
        with self._lock:
            self._writer.close()

    def close_reader(self) -> None:
        """Only from the thread that calls `recv` (closing under a blocked read would wait for it)."""
        with contextlib.suppress(OSError):
            self._reader.close()


class FunctionError(Exception):
    """A failed invocation: what the function raised in the worker (type, message, traceback)."""

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        super().__init__(message)
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}"


class FunctionTimeout(FunctionError):
    """The invocation ran past host.json functionTimeout; its worker process was restarted."""


class WorkerGone(FunctionError):
    """The worker process died or was restarted while the invocation was in flight."""


@dataclass(frozen=True)
class Outcome:
    """A successful invocation: queue output bodies by binding name, and the HTTP response."""

    queue_outputs: dict[str, list[bytes]] = field(default_factory=dict)
    http: HttpResult | None = None


def outcome_from(result: tuple[Any, ...]) -> Outcome:
    """Turn a `done` frame's result into an Outcome, or raise the FunctionError it carries."""
    if result[0] == "ok":
        return Outcome(result[1], result[2])
    _, type_name, message, traceback_text = result
    raise FunctionError(str(type_name), str(message), str(traceback_text))


def error_text(error: BaseException) -> str:
    """'Type: message' of a failure, whichever process it happened in."""
    return str(error) if isinstance(error, FunctionError) else f"{type(error).__name__}: {error}"


def failure_details(error: BaseException) -> str:
    """The traceback to log after a failed invocation ("" if none): the worker's text, or ours."""
    if isinstance(error, FunctionError):
        text = error.traceback_text
    else:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return "\n" + text.rstrip() if text else ""
