"""Azurite's blob reads after it has been idle, with Node's default V8 flags and with the devstack's.

With Node's defaults, V8 shrinks an idle Azurite's heap after ~8 s, and from then on every large
blob read runs mark-compacts back to back; `devstack.azurite.NODE_FLAGS` keeps the heap. For each
flag set: start Azurite, upload one blob, read it with the app's reader (`shared.blobio.reader`,
the job's path) right away, wait `--idle` seconds, read it again. Prints the wall time of each
read and the CPU seconds Azurite spent on it (Linux /proc).

    python -m bench.bench_azurite_idle             # 300 MB, 12 s idle, 3 reads each
    python -m bench.bench_azurite_idle --mb 50 --reads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.bench_read import process_cpu_s  # noqa: E402
from devstack import datagen  # noqa: E402
from devstack.azurite import NODE_FLAGS, Azurite, start_azurite  # noqa: E402

CONTAINER = "bench"


def read_once(az: Azurite, blob: str) -> tuple[float, float]:
    """(wall seconds, Azurite CPU seconds) of one read of the blob through the app's reader."""
    from azure.storage.blob import BlobServiceClient

    from shared.blobio.reader import BlobReader

    assert az.process is not None
    service = BlobServiceClient.from_connection_string(az.connection_string)
    reader = BlobReader.from_credential(service.url.rstrip("/"), service.credential)
    cpu = process_cpu_s(az.process.pid)
    start = time.perf_counter()
    with reader.open(CONTAINER, blob) as stream:
        while (got := stream.next_chunk()) is not None:
            stream.give_back(got[0])
    return time.perf_counter() - start, process_cpu_s(az.process.pid) - cpu


def measure(path: Path, flags: tuple[str, ...], idle_s: float, reads: int) -> dict[str, Any]:
    from azure.storage.blob import BlobServiceClient

    az = start_azurite(node_flags=flags)
    try:
        service = BlobServiceClient.from_connection_string(az.connection_string)
        service.create_container(CONTAINER)
        with path.open("rb") as fh:
            service.get_blob_client(CONTAINER, path.name).upload_blob(fh, overwrite=True, max_concurrency=4)
        fresh = [read_once(az, path.name) for _ in range(reads)]
        time.sleep(idle_s)
        idle = [read_once(az, path.name) for _ in range(reads)]
    finally:
        az.cleanup()
    return {
        "flags": " ".join(flags) or "(Node's defaults)",
        "fresh_wall_s": [round(w, 3) for w, _ in fresh],
        "fresh_azurite_cpu_s": [round(c, 3) for _, c in fresh],
        "idle_wall_s": [round(w, 3) for w, _ in idle],
        "idle_azurite_cpu_s": [round(c, 3) for _, c in idle],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=300, help="blob size (MB of narrow CSV)")
    parser.add_argument("--idle", type=float, default=12.0, help="seconds idle between the two sets of reads")
    parser.add_argument("--reads", type=int, default=3, help="reads in each set")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "aggregate-bench-read")
    args = parser.parse_args(argv)
    path = args.data_dir / f"sales-{args.mb:g}mb.csv"
    if not path.exists():
        args.data_dir.mkdir(parents=True, exist_ok=True)
        datagen.write_repeated(path, args.mb, fmt="csv", wide=False)
    print(f"{path.name}: read right after the upload, then after {args.idle:g} s idle (seconds)")
    for flags in ((), NODE_FLAGS):
        row = measure(path, flags, args.idle, args.reads)
        print(f"\n{row['flags']}")
        for when in ("fresh", "idle"):
            walls, cpus = row[f"{when}_wall_s"], row[f"{when}_azurite_cpu_s"]
            print(
                f"  {when:5}  read wall {statistics.median(walls):.3f} (all {walls})"
                f"  Azurite CPU {statistics.median(cpus):.3f} (all {cpus})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
