"""No two modules of the app share a file name: a name says which module it is."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

SHARED = Path(__file__).resolve().parents[3] / "shared"


def test_no_two_modules_of_shared_share_a_file_name() -> None:
    names = Counter(p.name for p in SHARED.rglob("*.py") if p.name != "__init__.py")
    assert len(names) > 50
    assert sorted(name for name, count in names.items() if count > 1) == []
