"""Build the pyFiles zip the Spark job needs on a cluster (the inline engine and its errors).

    python -m spark_jobs.package dist/aggregate_engine.zip

Upload it next to `aggregate_job.py` and set SPARK_PY_FILES to its URL.
"""

from __future__ import annotations

import sys
from pathlib import Path

from spark_jobs.aggregate_job import build_engine_zip

REPO_ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    dest = Path(argv[0]) if argv else REPO_ROOT / "dist" / "aggregate_engine.zip"
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(build_engine_zip(REPO_ROOT, dest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
