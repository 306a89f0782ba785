"""A spill's folder on local disk, and the sweep of folders whose process died mid-job.

A folder is marked as its process's by an exclusive `flock` on a file in it (`.owner`): the kernel
lets the lock go when the process ends, however it ends (kill -9, out of memory), so a folder
whose lock can be taken has no owner. Before a new folder is made, the folders of that kind in
the same directory are swept: those whose lock is free are removed, with what they hold. A
worker killed while its groups were spilled (up to hundreds of MB with a raised MAX_GROUPS) then
leaves its runs only until the next spill on that machine, not until the disk fills.

Kept: a folder whose lock is held (a live job, in this process or another), one whose lock file
is younger than `GRACE_S` (made, its lock not yet taken), and one without a lock file younger
than `UNLOCKED_AGE_S` (being made, or an earlier build's). The sweep never raises: a folder it
cannot judge or remove stays.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import weakref
from typing import Final

try:
    import fcntl
except ImportError:  # pragma: no cover - not Linux: no lock, lockless folders swept by age only
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("aggregate.spill")

PREFIX: Final = "aggregate-runs-"
LOCK_NAME: Final = ".owner"
GRACE_S: Final = 60.0
"""A lock file this young may be between its making and its lock: its folder is kept."""
UNLOCKED_AGE_S: Final = 86_400.0
"""A folder with no lock file (an earlier build's, or one being made) is removed past this age:
a day, where functionTimeout bounds a job to 10 minutes."""


class SpillFolder:
    """A temporary folder for one job's runs, locked by this process until `cleanup` (or until
    the process ends: the lock goes with it, and the next sweep removes the folder)."""

    def __init__(self, directory: str | None = None) -> None:
        sweep(directory)
        self.name = tempfile.mkdtemp(prefix=PREFIX, dir=directory)
        self._fd = os.open(os.path.join(self.name, LOCK_NAME), os.O_CREAT | os.O_RDWR, 0o600)
        if fcntl is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._finalizer = weakref.finalize(self, _remove, self.name, self._fd)

    def cleanup(self) -> None:
        """Remove the folder and what it holds, then let the lock go (once; later calls do nothing)."""
        self._finalizer()


def _remove(name: str, fd: int) -> None:
    shutil.rmtree(name, ignore_errors=True)
    os.close(fd)


def sweep(directory: str | None = None, now: float | None = None) -> list[str]:
    """Remove the spill folders in `directory` (None: the system's temporary directory) that no
    process owns; the paths removed."""
    root = directory or tempfile.gettempdir()
    moment = time.time() if now is None else now
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            if _abandoned(entry.path, moment):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
        except OSError:
            continue
    if removed:
        log.info("removed %d spill folder(s) left by processes that ended mid-job", len(removed))
    return removed


def _abandoned(path: str, now: float) -> bool:
    """True when no process owns the folder: its lock is free and not new, or it has no lock
    file and is older than UNLOCKED_AGE_S."""
    try:
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR)
    except FileNotFoundError:
        return now - os.stat(path).st_mtime > UNLOCKED_AGE_S
    try:
        if now - os.fstat(fd).st_mtime < GRACE_S:
            return False
        if fcntl is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a live job's
            return False
        return True
    finally:
        os.close(fd)
