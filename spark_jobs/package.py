"""Build the pyFiles zip the Spark job needs on a cluster (the inline engine and its errors).

    python -m spark_jobs.package [dist/aggregate_engine.zip]
    python -m spark_jobs.package --native [ZIP]                  # with this venv's C scanner
    python -m spark_jobs.package --native-wheel aggkernel-....whl [ZIP]   # a build for the cluster

With `--native` or `--native-wheel` the zip holds a build of the C scanner (`aggkernel`), which the
job hands to the executors (SparkFiles) and they load; where it cannot load (another platform),
they parse on the Python path and say why (docs/spark.md). Upload it next to `aggregate_job.py`
and set SPARK_PY_FILES to its URL.
"""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path

from spark_jobs.aggregate_job import build_engine_zip, own_scanner

REPO_ROOT = Path(__file__).resolve().parent.parent


class ScannerNotFound(Exception):
    """No scanner build where one was asked for (`--native`, `--native-wheel`)."""


def wheel_scanner(wheel: Path) -> tuple[str, bytes]:
    """(file name, bytes) of the scanner in a wheel built for the cluster's platform."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if "/" not in n and n.startswith("aggkernel") and n.endswith(".so")]
        if len(names) != 1:
            raise ScannerNotFound(f"{wheel.name} holds no single aggkernel extension ({names})")
        return names[0], zf.read(names[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_jobs.package", description=__doc__.splitlines()[0])
    parser.add_argument("dest", nargs="?", default=str(REPO_ROOT / "dist" / "aggregate_engine.zip"))
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--native", action="store_true", help="add this Python's built C scanner")
    which.add_argument(
        "--native-wheel", type=Path, help="add the C scanner of this wheel (the cluster's platform)"
    )
    args = parser.parse_args(argv)
    try:
        scanner = wheel_scanner(args.native_wheel) if args.native_wheel else None
        if args.native:
            scanner = own_scanner()
            if scanner is None:
                raise ScannerNotFound("aggkernel is not built in this Python (build native/ with pip first)")
    except (ScannerNotFound, OSError) as exc:
        parser.error(str(exc))
    dest = Path(args.dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(build_engine_zip(REPO_ROOT, dest, scanner))
    if scanner is not None:
        print(f"with the C scanner {scanner[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
