"""The C scanner's two builds: the x86-64-v2 one (popcnt, SSSE3, SSE4.1; `native/src/csv_v2.c`,
`jsonl_v2.c`), chosen at import where the CPU has those instructions, and the portable one
(`AGGKERNEL_PORTABLE=1`). They must give the same answers on every input; short numbers, which
the v2 build reads 16 bytes at a time, are where they differ in code.
"""

from __future__ import annotations

import os
import pickle
import platform
import random
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import aggkernel
import pytest

PAD = b"a-first-field-of-20b"
"""Before each number: the v2 build reads a number 16 bytes at a time only where the 16 bytes
ending with it are in the block."""
TRICKY = [
    "0", "-0", "00", "007", "0.0", "-0.0", "0.5", "00.50", "7.9", "21.4", "-3.25", "107.74",
    "1.", ".5", "-.5", "-", "--1", "1.2.3", "1..2", "+3", "1e5", "1E-2", " 12", "12 ", "\t1", "1\t",
    "NaN", "inf", "-inf", "1_0", "0x10", "\uff11\uff12",
    "123456789012345", "-123456789012345", "1234567890123456", "12345678901234.5",
    "1.23456789012345", "0.000000000000001", "1234567890123.45", "-1234567890123.45",
    "9007199254740993", "999999999999999", "99999999999999.9", "0.30000000000000004", "0.1",
]  # fmt: skip
ALPHABET = "0123456789" * 4 + "..--e +\t"


def corpus(count: int = 4000, seed: int = 7) -> list[str]:
    """The tricky values, then random strings of 0-18 characters, mostly number-like."""
    rng = random.Random(seed)
    values = list(TRICKY)
    while len(values) < count:
        values.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 18))))
    return values


def answers(values: list[str]) -> list[Any]:
    """The scanner's answers for each value, alone in a block of three records after PAD: as a
    CSV field, as a JSON value and as a JSON string."""
    out = []
    for value in values:
        text = value.encode()
        record = PAD + b"," + text + b"\n"
        out.append(aggkernel.csv_reduce(record * 3, (-1, 0), (), (0,), (1,), (b"",)))
        for json_value in (text, b'"' + text + b'"'):
            line = b'{"pad": "' + PAD + b'", "x": ' + json_value + b"}\n"
            out.append(aggkernel.jsonl_reduce(line * 3, (b"x",), (), (0,), (1,), (b"",)))
    return out


def portable_answers(values: list[str]) -> tuple[str, list[Any]]:
    """`answers` in a process that imports the scanner with AGGKERNEL_PORTABLE=1."""
    code = (
        "import pickle, sys; sys.path.insert(0, sys.argv[1]); import aggkernel;"
        "from tests.unit.test_aggkernel_cpu import answers;"
        "values = pickle.load(sys.stdin.buffer);"
        "sys.stdout.buffer.write(pickle.dumps((aggkernel.BUILD, answers(values))))"
    )
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(aggkernel.__file__).parent)],
        input=pickle.dumps(values),
        capture_output=True,
        check=True,
        cwd=root,
        env={**os.environ, "AGGKERNEL_PORTABLE": "1"},
        timeout=120,
    )
    scan, got = pickle.loads(done.stdout)
    return scan, got


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_the_v2_scan_runs_where_the_cpu_has_its_instructions() -> None:
    compiler = str(sysconfig.get_config_var("CC") or "")
    if platform.machine() != "x86_64" or sys.platform != "linux" or "clang" in compiler:
        pytest.skip("the v2 build is made by GCC for x86-64 Linux")
    if not {"popcnt", "ssse3", "sse4_1"} <= cpu_flags():
        assert aggkernel.BUILD == "portable"
        return
    assert aggkernel.BUILD == "x86-64-v2"


def test_both_builds_read_every_value_alike() -> None:
    values = corpus()
    scan, portable = portable_answers(values)
    assert scan == "portable"
    mine = answers(values)
    tried = [(value, kind) for value in values for kind in ("csv", "json", "json string")]
    differ = [(v, a, b) for v, a, b in zip(tried, mine, portable, strict=True) if a != b]
    assert not differ, differ[:5]
    read = 0
    for (value, _), answer in zip(tried, mine, strict=True):
        if answer is None or answer[4][0][5]:  # left to the Python path, or null
            continue
        count, total, low, high, _, _ = answer[4][0]
        (expected,) = struct.unpack("<d", low)
        assert struct.unpack("<q", count)[0] == 3 and low == high, value
        assert struct.unpack("<d", total)[0] == expected + expected + expected, value
        assert expected == float(value) and math_sign(expected) == math_sign(float(value)), value
        read += 1
    assert read > 1500  # the corpus reaches the fast path, not only the fallbacks


def math_sign(x: float) -> bool:
    return struct.pack("<d", x)[7] >= 0x80
