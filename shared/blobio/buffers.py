"""Buffers of one size kept between the inputs that use them: fresh memory is faulted in 4 KiB at
a time, which costs about as much as parsing those bytes.

Used by the blob reader's streams (`shared.blobio.stream`) and the engine's blocks
(`shared.aggregation.blocks`). Only the standard library: the Spark job ships it as it is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final

POOL_IDLE_S: Final = 60.0
"""Kept buffers wait this long for the next user, then are freed."""


class BufferPool:
    """Buffers of one size kept from closed users for the next ones, at most `keep`, all freed
    after `idle_s` without one given back.

    Fresh memory is faulted in 4 KiB at a time: 11 new 8 MiB buffers took 42-50 ms of CPU, ~13% of
    the engine's over a 300 MB blob, and every stream paid it (`bench.bench_read`).
    """

    def __init__(
        self,
        size: int,
        keep: int,
        idle_s: float = POOL_IDLE_S,
        timer: Callable[[float, Callable[[], None]], Any] = threading.Timer,
    ) -> None:
        self.size, self.keep, self.idle_s = size, keep, idle_s
        self._timer_factory = timer
        self._free: list[bytearray] = []
        self._lock = threading.Lock()
        self._timer: Any = None
        self.created = 0
        """Buffers this pool had to allocate (none were free)."""

    def take(self) -> bytearray:
        with self._lock:
            if self._free:
                return self._free.pop()
            self.created += 1
        return bytearray(self.size)

    def put(self, buffers: list[bytearray]) -> None:
        """Keep these (no longer read or written by anyone) for the next user."""
        with self._lock:
            for buf in buffers:
                if len(self._free) < self.keep and len(buf) == self.size:
                    self._free.append(buf)
            if self._timer is not None:
                self._timer.cancel()
            timer = self._timer_factory(self.idle_s, lambda: self._drop_unless_rearmed(timer))
            timer.daemon = True
            timer.start()
            self._timer = timer

    def drop(self) -> None:
        """Free the kept buffers now."""
        with self._lock:
            self._free.clear()
            self._timer = None

    def _drop_unless_rearmed(self, timer: Any) -> None:
        """The idle timer's action: a timer that fires as a later `put` cancels it frees nothing."""
        with self._lock:
            if self._timer is timer:
                self._free.clear()
                self._timer = None

    @property
    def kept(self) -> int:
        with self._lock:
            return len(self._free)


_POOLS: dict[tuple[int, int], BufferPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(size: int, keep: int) -> BufferPool:
    """The process's pool of `size`-byte buffers (one per size and bound)."""
    with _POOLS_LOCK:
        pool = _POOLS.get((size, keep))
        if pool is None:
            pool = _POOLS[(size, keep)] = BufferPool(size, keep)
        return pool
