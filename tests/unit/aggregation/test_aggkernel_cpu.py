"""The C scanner's builds: the x86-64-v3 CSV scan (AVX2, BMI1/2; `native/src/csv_v3.c`), chosen
at import where the CPU has those instructions and runs pdep in hardware; the x86-64-v2 ones
(popcnt, SSSE3, SSE4.1; `csv_v2.c`, `jsonl_v2.c`); the portable ones. `AGGKERNEL_BUILD` caps the
choice (`AGGKERNEL_PORTABLE=1`: portable). They must give the same answers on every input: short
numbers (read 16 bytes at a time from v2 on), and a record's commas and breaks (found 32 bytes at
a time, a needed comma by pdep, in v3) are where they differ in code.
"""

from __future__ import annotations

import ast
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


def structure_answers(seeds: list[int]) -> list[Any]:
    """The scanner's answers on random blocks of CSV records, one per seed: 1-40 fields, some
    quoted (commas, "" and line breaks inside), \n, \r\n or \r ends, empty lines, a record with a
    field too few or too many; each block read for three sets of needed fields."""
    out = []
    for seed in seeds:
        rng = random.Random(seed)
        nfields = rng.randint(1, 40)
        texts = ["", "7", "-1.25", "a", "NA", "xyz" * rng.randint(1, 30), '"q,""x"""', '"a\nb"', '"1,5"']
        ends = [b"\n", b"\r\n", b"\r"] if rng.random() < 0.3 else [b"\n"]
        lines = []
        for _ in range(rng.randint(1, 200)):
            width = nfields + (rng.choice([-1, 1]) if rng.random() < 0.01 else 0)
            line = ",".join(rng.choice(texts) for _ in range(max(width, 1))).encode()
            lines.append(line + rng.choice(ends) + (b"\n" if rng.random() < 0.05 else b""))
        block = b"".join(lines)
        for _ in range(3):
            needed = rng.sample(range(nfields), rng.randint(1, min(nfields, 4)))
            cols = tuple(needed.index(f) if f in needed else -1 for f in range(nfields))
            values = tuple(range(1, len(needed)))
            out.append(aggkernel.csv_reduce(block, cols, (0,), values, (0,) * len(values), (b"", b"NA")))
    return out


def build_answers(build: str, function: str, arguments: list[Any]) -> tuple[str, list[Any]]:
    """`function(arguments)` of this module in a process that imports the scanner with
    AGGKERNEL_BUILD=build."""
    code = (
        "import pickle, sys; sys.path.insert(0, sys.argv[1]); import aggkernel;"
        f"from tests.unit.aggregation.test_aggkernel_cpu import {function};"
        "arguments = pickle.load(sys.stdin.buffer);"
        f"sys.stdout.buffer.write(pickle.dumps((aggkernel.BUILD, {function}(arguments))))"
    )
    root = str(Path(__file__).resolve().parents[3])
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(aggkernel.__file__).parent)],
        input=pickle.dumps(arguments),
        capture_output=True,
        check=True,
        cwd=root,
        env={**os.environ, "AGGKERNEL_BUILD": build},
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


def cpu_vendor_family() -> tuple[str, int]:
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields.get("vendor_id", ""), int(fields.get("cpu family", "0"))


def v2_built() -> bool:
    compiler = str(sysconfig.get_config_var("CC") or "")
    return platform.machine() == "x86_64" and sys.platform == "linux" and "clang" not in compiler


def test_the_newest_build_the_cpu_runs_well_is_chosen() -> None:
    if not v2_built():
        pytest.skip("the v2 and v3 builds are made by GCC for x86-64 Linux")
    flags = cpu_flags()
    vendor, family = cpu_vendor_family()
    pdep = vendor == "GenuineIntel" or (vendor in ("AuthenticAMD", "HygonGenuine") and family >= 0x19)
    if not {"popcnt", "ssse3", "sse4_1"} <= flags:
        assert aggkernel.BUILD == "portable"
    elif {"avx", "avx2", "bmi1", "bmi2"} <= flags and pdep:
        assert aggkernel.BUILD == "x86-64-v3"
    else:
        assert aggkernel.BUILD == "x86-64-v2"


@pytest.mark.parametrize("build", ["portable", "x86-64-v2"])
def test_a_cap_on_the_build_is_kept(build: str) -> None:
    if not v2_built():
        pytest.skip("the v2 and v3 builds are made by GCC for x86-64 Linux")
    scan, _ = build_answers(build, "answers", ["1"])
    assert scan == ("portable" if aggkernel.BUILD == "portable" else build)


def test_the_profile_guided_build_trains_every_build_the_cpu_runs() -> None:
    """native/setup.py trains once per cap in TRAINED_BUILDS: together they reach every build
    this CPU can run (an untrained v2 CSV scan was 38% slower on the narrow benchmark CSV)."""
    if not v2_built() or aggkernel.BUILD == "portable":
        pytest.skip("one build only here")
    tree = ast.parse((Path(__file__).resolve().parents[3] / "native" / "setup.py").read_text())
    caps = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TRAINED_BUILDS"
    )
    reached = {build_answers(cap, "answers", ["1"])[0] for cap in caps}
    assert reached == {"portable", "x86-64-v2", aggkernel.BUILD}


def test_every_build_reads_a_records_fields_alike() -> None:
    seeds = list(range(300))
    mine = structure_answers(seeds)
    assert sum(answer is not None for answer in mine) > 300  # most blocks are answered
    for build in ("portable", "x86-64-v2"):
        scan, theirs = build_answers(build, "structure_answers", seeds)
        differ = [(seed // 3, a, b) for seed, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]
        assert not differ, (scan, differ[:3])


def test_both_builds_read_every_value_alike() -> None:
    values = corpus()
    scan, portable = build_answers("portable", "answers", values)
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
