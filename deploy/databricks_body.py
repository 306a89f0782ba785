"""Request body of a Databricks file upload: `python3 -m deploy.databricks_body KIND PATH FILE`.

KIND is `workspace` (POST /api/2.0/workspace/import: a workspace file, format AUTO, overwrite) or
`dbfs` (POST /api/2.0/dbfs/put, files up to 1 MB, overwrite). Standard library only, so any
python3 works; used by deploy/deploy_spark_job.sh.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Sequence
from pathlib import Path

DBFS_PUT_LIMIT = 1024 * 1024


def body(kind: str, path: str, source: Path) -> dict[str, object]:
    content = base64.b64encode(source.read_bytes()).decode("ascii")
    if kind == "workspace":
        return {"path": path, "format": "AUTO", "overwrite": True, "content": content}
    if kind == "dbfs":
        if source.stat().st_size > DBFS_PUT_LIMIT:
            raise ValueError(f"{source} is larger than the 1 MB DBFS put limit; use a workspace path")
        return {"path": path, "contents": content, "overwrite": True}
    raise ValueError(f"unknown kind {kind!r} (workspace or dbfs)")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    kind, path, source = args
    try:
        print(json.dumps(body(kind, path, Path(source))))
    except (OSError, ValueError) as exc:
        print(f"databricks_body: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
