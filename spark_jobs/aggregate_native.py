"""The C scanner (`aggkernel`, native/) on the executors of the aggregate job.

The engine zip may hold a build of the scanner (`python -m spark_jobs.package --native` or
`--native-wheel`): `SCANNER_FILE`, with its original file name beside it. The driver hands it to
the executors with `SparkContext.addFile` (`ship`); each task loads it from SparkFiles as the
module `aggkernel` before the engine is imported (`load`). A build that does not load there
(another platform, a missing file) leaves the engine on its Python path, with the reason, said
once per executor process and reported to the driver in each task's result. Without a shipped
build the executor's own installed `aggkernel`, if any, is used; `use=False` turns the scanner off.

Shipped to the cluster in the engine zip (`JOB_MODULES`); standard library only.
"""

from __future__ import annotations

import importlib.util
import pkgutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCANNER_FILE = "native/aggkernel.so"
"""Where the engine zip holds the scanner's build, in the `spark_jobs` package (its original file
name beside it: SOURCE_FILE); `aggregate_job.build_engine_zip` puts them there."""
SOURCE_FILE = "native/aggkernel.txt"
SPARK_FILE = "aggkernel-shipped.so"
"""The scanner's name among the job's SparkFiles."""


@dataclass(frozen=True)
class ScannerChoice:
    """What the tasks load (picklable): the shipped file's SparkFiles name, or none."""

    file: str | None = None
    use: bool = True


# --- the driver ----------------------------------------------------------------------------------


def in_engine() -> tuple[str, bytes] | None:
    """(original name, bytes) of the scanner in the engine on this Python's path, None without."""
    try:
        data = pkgutil.get_data("spark_jobs", SCANNER_FILE)
        name = pkgutil.get_data("spark_jobs", SOURCE_FILE)
    except OSError:
        return None
    if data is None or name is None:
        return None
    return name.decode("utf-8"), data


def ship(add_file: Any, build: tuple[str, bytes] | None, use: bool = True) -> ScannerChoice:
    """Hand `build` to the executors (`SparkContext.addFile`); what the tasks should load."""
    if build is None or not use:
        return ScannerChoice(None, use)
    path = Path(tempfile.mkdtemp(prefix="aggkernel-")) / SPARK_FILE
    path.write_bytes(build[1])
    add_file(str(path))
    return ScannerChoice(SPARK_FILE, True)


# --- the executors -------------------------------------------------------------------------------

_status: str | None = None


def load(choice: ScannerChoice) -> str:
    """Make `import aggkernel` give the chosen build (or fail: the Python path) before the engine
    is imported in this process; what was decided, said once per process."""
    global _status
    if _status is None:
        _status = _decide(choice)
        print(f"aggregate task: {_status}", file=sys.stderr, flush=True)
    return _status


def _decide(choice: ScannerChoice) -> str:
    if "shared.aggregation.native" in sys.modules:
        return _status_of(sys.modules["shared.aggregation.native"].kernel, "already imported")
    if not choice.use:
        sys.modules["aggkernel"] = None  # type: ignore[assignment]
        return "python path (the scanner is turned off)"
    if choice.file is None:
        try:
            import aggkernel
        except ImportError:
            return "python path (no scanner shipped or installed)"
        return _status_of(aggkernel, "installed")
    try:
        from pyspark import SparkFiles

        path = SparkFiles.get(choice.file)
        found = importlib.util.spec_from_file_location("aggkernel", path)
        if found is None or found.loader is None:
            raise ImportError(f"{path} is no extension module")
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
    except (ImportError, OSError) as exc:
        sys.modules["aggkernel"] = None  # type: ignore[assignment]
        reason = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
        return f"python path (the shipped scanner does not load here: {reason[0][:300]})"
    sys.modules["aggkernel"] = module
    return _status_of(module, "shipped")


def _status_of(module: Any, origin: str) -> str:
    if module is None:
        return f"python path ({origin})"
    return f"scanner {getattr(module, 'BUILD', '?')} ({origin})"
