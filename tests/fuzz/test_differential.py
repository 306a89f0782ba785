"""Short, seeded differential fuzz: the C scanner and the Python path, at every block size of
`differential.BLOCK_SIZES`, give one answer (or one error) per input. `make fuzz` runs it long,
under ASan and UBSan."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from shared.aggregation import engine
from shared.aggregation.options import DEFAULT_OPTIONS, EngineOptions
from tests.conftest import tier_cases
from tests.fuzz import differential, parquet_mutations


def test_jsonl_scanner_python_path_and_block_sizes_agree() -> None:
    report = differential.run(seed=19, cases=tier_cases(150), formats=("jsonl",))
    assert report.cases == tier_cases(150)
    assert not report.mismatches, "\n\n".join(report.mismatches[:3])


def test_csv_scanner_python_path_and_block_sizes_agree() -> None:
    report = differential.run(seed=19, cases=tier_cases(150), formats=("csv",))
    assert report.cases == tier_cases(150)
    assert not report.mismatches, "\n\n".join(report.mismatches[:3])


def test_parquet_scanner_and_pyarrow_agree_and_mutated_pages_are_survived() -> None:
    report = differential.parquet_run(seed=19, cases=tier_cases(60))
    assert report.cases == tier_cases(60)
    assert not report.mismatches, "\n\n".join(report.mismatches[:3])


def test_parquet_files_mutated_are_answered_as_pyarrow_answers_them_or_refused() -> None:
    report = parquet_mutations.run(seed=23, cases=tier_cases(120))
    assert report.cases == tier_cases(120)
    assert 0 < report.refused < report.cases  # some mutations break the file, some do not
    assert not report.mismatches, "\n\n".join(report.mismatches[:3])


def test_a_block_size_that_answers_otherwise_is_counted_once_per_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = engine.aggregate_stream

    def off_at_37(stream: Any, spec: Any, *, options: EngineOptions = DEFAULT_OPTIONS) -> Any:
        result = real(stream, spec, options=options)
        return replace(result, input_rows=result.input_rows + 1) if options.block_size == 37 else result

    monkeypatch.setattr(engine, "aggregate_stream", off_at_37)
    report = differential.run(seed=1, cases=20, formats=("csv", "jsonl"))
    assert report.cases == 20
    assert len(report.mismatches) == 20 - _agreeing_errors(seed=1, cases=20) > 0


def _agreeing_errors(seed: int, cases: int) -> int:
    """Cases whose answer is an error at every block size (an altered row count cannot show)."""
    rng = random.Random(seed)
    count = 0
    for _ in range(cases):
        case = differential.make_case(rng)
        count += differential.outcome(case, False, 1 << 20)[0] in ("error", "payload")
    return count
