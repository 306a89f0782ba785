"""Spill folders: locked by their process, swept once it has died (a real process, killed -9)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.aggregation import aggregate_rows, parse_aggregate_payload, spill_folder
from shared.aggregation.options import EngineOptions
from shared.aggregation.spill import SpillLimits
from shared.aggregation.spill_folder import GRACE_S, LOCK_NAME, PREFIX, UNLOCKED_AGE_S, SpillFolder, sweep

REPO = Path(__file__).resolve().parents[3]
OWNER = """
import sys, time
sys.path.insert(0, {repo!r})
from shared.aggregation.spill_folder import SpillFolder
folder = SpillFolder({directory!r})
open(folder.name + "/run-1.arrow", "wb").write(b"x" * 4096)
print(folder.name, flush=True)
time.sleep(60)
"""


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A process holding a spill folder in tmp_path (stopped by the test or at the end)."""
    code = OWNER.format(repo=str(REPO), directory=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    folder = Path(proc.stdout.readline().strip())
    try:
        yield proc, folder
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()


def aged(folder: Path, seconds: float) -> None:
    """Its lock file (and the folder) as if made `seconds` ago."""
    past = time.time() - seconds
    for path in (folder / LOCK_NAME, folder):
        if path.exists():
            os.utime(path, (past, past))


def test_a_folder_whose_process_was_killed_is_removed_by_the_next_spill(
    owner: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    proc, folder = owner
    assert (folder / "run-1.arrow").exists()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    aged(folder, GRACE_S + 1)
    made = SpillFolder(str(tmp_path))
    try:
        assert not folder.exists(), "the dead worker's runs should be gone"
        assert Path(made.name).is_dir() and Path(made.name).name.startswith(PREFIX)
    finally:
        made.cleanup()
    assert not Path(made.name).exists()


def test_a_live_processs_folder_is_kept_however_old(
    owner: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    _proc, folder = owner
    aged(folder, UNLOCKED_AGE_S * 2)
    assert sweep(str(tmp_path)) == []
    assert (folder / "run-1.arrow").exists()


def test_a_folder_of_this_process_is_kept_until_its_cleanup(tmp_path: Path) -> None:
    first = SpillFolder(str(tmp_path))
    aged(Path(first.name), GRACE_S + 1)
    second = SpillFolder(str(tmp_path))  # its sweep meets first's lock (flock: per open file)
    assert Path(first.name).is_dir()
    first.cleanup()
    first.cleanup()  # once
    assert not Path(first.name).exists() and Path(second.name).is_dir()
    second.cleanup()


def test_a_free_lock_within_the_grace_and_a_young_lockless_folder_are_kept(tmp_path: Path) -> None:
    made = tmp_path / f"{PREFIX}made"  # its lock file made, not yet locked
    made.mkdir()
    (made / LOCK_NAME).touch()
    aged(made, GRACE_S - 10)
    young = tmp_path / f"{PREFIX}young"  # no lock file yet (or an earlier build's, in use)
    young.mkdir()
    aged(young, UNLOCKED_AGE_S - 60)
    other = tmp_path / "something-else"
    other.mkdir()
    aged(other, UNLOCKED_AGE_S * 2)
    assert sweep(str(tmp_path)) == []
    aged(made, GRACE_S + 1)
    aged(young, UNLOCKED_AGE_S + 60)
    assert sorted(sweep(str(tmp_path))) == sorted([str(made), str(young)])
    assert other.is_dir()


def test_a_missing_directory_sweeps_nothing(tmp_path: Path) -> None:
    assert spill_folder.sweep(str(tmp_path / "absent")) == []


def test_a_spilling_job_removes_a_dead_ones_folder_and_leaves_none(
    owner: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    proc, folder = owner
    proc.kill()
    proc.wait(10)
    aged(folder, GRACE_S + 1)
    data = ("k,v\n" + "".join(f"g{i:04d},{i}\n" for i in range(500))).encode()
    spec = parse_aggregate_payload(
        {
            "input": "data/in.csv",
            "format": "csv",
            "group_by": ["k"],
            "metrics": [{"op": "sum", "column": "v"}],
        }
    )
    limits = SpillLimits(spill_rows=40, batch_rows=7, range_rows=50, max_runs=3, directory=str(tmp_path))
    options = EngineOptions(block_size=2048, combine_rows=64)
    with aggregate_rows(io.BytesIO(data), spec, options=options, limits=limits) as result:
        assert result.spilled is not None and result.groups == 500
        assert not folder.exists(), "the dead worker's runs should be gone"
        assert [p.name[: len(PREFIX)] for p in tmp_path.iterdir()] == [PREFIX]
    assert list(tmp_path.iterdir()) == []
