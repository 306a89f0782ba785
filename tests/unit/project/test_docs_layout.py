"""docs/development.md's file table and README's layout table match the tree, and the Makefile's
test tiers are documented."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DEVELOPMENT = ROOT / "docs" / "development.md"
TOP = {p.name for p in ROOT.iterdir()}
CODE = re.compile(r"`([^`\s]+)`")
FILE = re.compile(r"^[\w\-]+\.(py|c|json|md|bicep)$")


def layout_rows(text: str) -> list[tuple[list[str], list[str]]]:
    """(the path column's names, the description's names) of each row of the table under
    '## Repository layout', names as written between backticks."""
    section = text.split("## Repository layout", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or set(cells[0]) <= {"-", " "} or cells[0] == "Path":
            continue
        rows.append((CODE.findall(cells[0]), CODE.findall(cells[1])))
    return rows


def is_path(name: str) -> bool:
    """A name of the repository's tree: under one of its top-level folders, or a top-level file."""
    return name.split("/", 1)[0] in TOP and ("/" in name or FILE.match(name) is not None)


def missing(rows: list[tuple[list[str], list[str]]]) -> list[str]:
    """Names in the table that are not in the tree: paths from the root, and file names in a row
    (`handler.py`) looked up in the row's folders (and below them)."""
    gone = []
    for heads, said in rows:
        folders = [ROOT / h for h in heads if h.endswith("/")]
        for name in heads + said:
            if is_path(name):
                if not (ROOT / name).exists():
                    gone.append(name)
            elif FILE.match(name) and folders and not any(next(f.rglob(name), None) for f in folders):
                gone.append(f"{name} (in {', '.join(h for h in heads if h.endswith('/'))})")
    return gone


def test_every_path_the_table_names_exists() -> None:
    rows = layout_rows(DEVELOPMENT.read_text(encoding="utf-8"))
    assert len(rows) > 20
    assert missing(rows) == []


def test_every_package_of_shared_has_its_row() -> None:
    heads = {h for row in layout_rows(DEVELOPMENT.read_text(encoding="utf-8")) for h in row[0]}
    packages = sorted(
        f"{p.parent.relative_to(ROOT).as_posix()}/" for p in (ROOT / "shared").rglob("__init__.py")
    )
    assert len(packages) > 10
    assert [p for p in packages if p not in heads] == []
    modules = [p.name for p in (ROOT / "shared").glob("*.py")]
    assert modules == ["__init__.py"], "a module at shared/'s top level: give it a package (and a row)"


def test_the_readme_names_every_package_of_shared_and_nothing_gone() -> None:
    rows = layout_rows((ROOT / "README.md").read_text(encoding="utf-8"))
    heads = {h for row in rows for h in row[0]}
    packages = sorted(f"shared/{p.parent.name}/" for p in (ROOT / "shared").glob("*/__init__.py"))
    assert len(packages) > 10
    assert [p for p in packages if p not in heads] == []
    assert missing(rows) == []


def test_the_check_finds_a_name_that_is_not_in_the_tree() -> None:
    table = (
        "## Repository layout\n\n| Path | What it holds |\n| --- | --- |\n"
        "| `shared/spark/` | `offload.py` for any kind, `slots.py`. |\n"
        "| `shared/spark/offload.py` | Gone. |\n| `make run/up` | Not a path. |\n"
    )
    assert missing(layout_rows(table)) == ["offload.py (in shared/spark/)", "shared/spark/offload.py"]


def make_targets() -> tuple[set[str], set[str]]:
    """(the targets `.PHONY` declares, the targets with a rule) of the Makefile."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    phony = set(re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split())  # type: ignore[union-attr]
    ruled = set(re.findall(r"^([\w\-]+):(?!=)", text, re.M))
    return phony, ruled


def test_every_phony_target_has_a_rule() -> None:
    phony, ruled = make_targets()
    assert phony - ruled == set()


def test_the_test_tiers_are_documented_in_the_readme() -> None:
    _, ruled = make_targets()
    tiers = sorted(t for t in ruled if t == "test" or t.startswith("test-"))
    assert tiers == ["test", "test-fast", "test-unit"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Test tiers", 1)[1].split("\n#", 1)[0]
    assert [t for t in tiers if f"`make {t}`" not in section] == []


def test_unit_tests_mirror_the_packages() -> None:
    """tests/unit holds a folder per package of shared/, each with tests, and nothing else (but
    `project/` for checks of the tree), no test module at its top level, and every test module's name
    is unique under tests/ (the folders have no __init__.py, so pytest imports test modules by their
    names)."""
    unit = ROOT / "tests" / "unit"
    packages = {p.parent.name for p in (ROOT / "shared").glob("*/__init__.py")}
    folders = {p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"}
    tested = {name for name in folders if any((unit / name).rglob("test_*.py"))}
    assert len(packages) > 10
    assert sorted(packages - tested) == [], "a package of shared/ without tests in tests/unit/<package>/"
    assert sorted(folders - packages) == ["project"]
    assert sorted(p.name for p in unit.glob("test_*.py")) == []
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
