"""docs/handlers.md's code blocks are the files that are tested: the doc cannot drift from them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BLOCK = re.compile(r"<!-- file: (?P<path>[^ ]+) -->\n```python\n(?P<code>.*?)```\n", re.DOTALL)


def test_every_file_block_of_the_handler_doc_equals_its_file() -> None:
    doc = (ROOT / "docs" / "handlers.md").read_text(encoding="utf-8")
    blocks = {m["path"]: m["code"] for m in BLOCK.finditer(doc)}
    assert set(blocks) == {"docs/examples/webhook.py", "tests/unit/jobs/test_webhook_example.py"}
    for path, code in blocks.items():
        assert code == (ROOT / path).read_text(encoding="utf-8"), f"docs/handlers.md's copy of {path} differs"


def test_the_worked_example_is_about_60_lines_with_about_80_of_tests() -> None:
    handler = (ROOT / "docs/examples/webhook.py").read_text(encoding="utf-8").count("\n")
    tests = (ROOT / "tests/unit/jobs/test_webhook_example.py").read_text(encoding="utf-8").count("\n")
    assert handler <= 70 and tests <= 90
