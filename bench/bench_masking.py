"""What masking a secret costs on an answer body (shared/net/masking.py), side by side in one run.

The `http` kind masks every body a call with a secret gets, before it cuts it, and the client
masks every error's body before cutting it to 400 characters. For bodies of each size: one
`bytes.replace` of the raw secret (the floor: what masking only the raw value cost), the masker
on a plain JSON body (no escape marks: the escaped forms are not searched), and on a body with an
escape mark every 16 bytes (the escaped forms searched everywhere: the worst case).

    python -m bench.bench_masking                 # 1 and 16 MiB, best of 3
    python -m bench.bench_masking --mib 4 --runs 5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from shared.net.masking import Masker  # noqa: E402

SECRET = "pArt/ner+Key-7Qx2w9Lm"


def best_of(runs: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def bodies(mib: int) -> dict[str, bytes]:
    size = mib * 1024 * 1024
    plain = (b'{"a": "' + b"x" * 100 + b'"}, ') * (size // 110)
    escaped = json.dumps(["x\\/y \u00e9"] * (size // 16)).encode()
    return {"plain JSON": plain[:size], "an escape every 16 B": escaped[:size]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, nargs="*", default=[1, 16])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    masker = Masker([SECRET])
    raw = SECRET.encode()
    print(f"{'body':>24} {'MiB':>4} {'replace s':>10} {'masker s':>9} {'ratio':>7}")
    for mib in args.mib:
        for name, body in bodies(mib).items():
            floor = best_of(args.runs, partial(body.replace, raw, b"***"))
            masked = best_of(args.runs, partial(masker.bytes, body))
            print(f"{name:>24} {mib:>4} {floor:>10.3f} {masked:>9.3f} {masked / floor:>6.0f}x")


if __name__ == "__main__":
    main()
