"""Short, seeded differential fuzz: the C scanner and the Python path, at every block size of
`differential.BLOCK_SIZES`, give one answer (or one error) per input. `make fuzz` runs it long,
under ASan and UBSan."""

from __future__ import annotations

from tests.fuzz import differential


def test_jsonl_scanner_python_path_and_block_sizes_agree() -> None:
    report = differential.run(seed=19, cases=150, formats=("jsonl",))
    assert report.cases == 150
    assert not report.mismatches, "\n\n".join(report.mismatches[:3])


def test_csv_scanner_python_path_and_block_sizes_agree() -> None:
    report = differential.run(seed=19, cases=150, formats=("csv",))
    assert report.cases == 150
    assert not report.mismatches, "\n\n".join(report.mismatches[:3])
