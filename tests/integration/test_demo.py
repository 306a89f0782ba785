"""`make run`'s demo, at a small scale: it exits 0 only when every check in it passed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devstack.hostproc import REPO_ROOT

pytestmark = pytest.mark.integration


def test_demo_runs_end_to_end() -> None:
    cmd = [sys.executable, "-m", "devstack.demo", "--jobs", "25", "--files", "2", "--rows", "3000",
           "--duplicates", "4", "--timeout", "300", "--spark-rows", "50000"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "25 / 25" in out and "10 / 10 equal" in out and "4 (sent 4)" in out
    assert "bad_input_data: column 'qty' has a value that is not a number on line 2" in out
    assert (
        "large job on Spark: completed, result equal to the inline engine's" in out
    )  # offloaded, via the ledger
