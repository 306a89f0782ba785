"""The C scanner (`aggkernel`, native/) on the executors of the aggregate job.

The engine zip may hold a build of the scanner (`python -m spark_jobs.package --native` or
`--native-wheel`): `SCANNER_ENTRY`, with its original file name beside it. The driver hands it to
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
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCANNER_ENTRY = "spark_jobs/native/aggkernel.so"
"""Where the engine zip holds the scanner's build."""
SOURCE_ENTRY = "spark_jobs/native/aggkernel.txt"
"""The build's original file name (its platform tag), beside it."""
SPARK_FILE = "aggkernel-shipped.so"
"""The scanner's name among the job's SparkFiles."""


class ScannerNotFound(Exception):
    """No scanner build where one was asked for (`--native`, `--native-wheel`)."""


@dataclass(frozen=True)
class ScannerChoice:
    """What the tasks load (picklable): the shipped file's SparkFiles name, or none."""

    file: str | None = None
    use: bool = True


# --- building the zip ----------------------------------------------------------------------------


def installed_scanner() -> Path:
    """The file of the `aggkernel` this Python imports (built into the venv by pip)."""
    found = importlib.util.find_spec("aggkernel")
    if found is None or found.origin is None or not found.origin.endswith(".so"):
        raise ScannerNotFound("aggkernel is not built here (build native/ with pip first)")
    return Path(found.origin)


def wheel_scanner(wheel: Path) -> tuple[str, bytes]:
    """(file name, bytes) of the scanner in a wheel built for the cluster's platform."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if "/" not in n and n.startswith("aggkernel") and n.endswith(".so")]
        if len(names) != 1:
            raise ScannerNotFound(f"{wheel.name} holds no single aggkernel extension ({names})")
        return names[0], zf.read(names[0])


def add_to_zip(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    """Put a scanner build into an engine zip being written."""
    zf.writestr(SCANNER_ENTRY, data)
    zf.writestr(SOURCE_ENTRY, name)


# --- the driver ----------------------------------------------------------------------------------


def in_engine() -> tuple[str, bytes] | None:
    """(original name, bytes) of the scanner in the engine on this Python's path, None without."""
    try:
        data = pkgutil.get_data("spark_jobs", "native/aggkernel.so")
        name = pkgutil.get_data("spark_jobs", "native/aggkernel.txt")
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
