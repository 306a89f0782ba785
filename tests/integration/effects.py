"""Counting the fault kind's side effects (see shared.jobs.testing.apply_effect)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from azure.storage.blob import ContainerClient

from shared.storage.ports import Blobs


@dataclass
class Effects:
    """Per job id: effect applied (0/1), executions that reached the effect, repeats absorbed."""

    applied: Counter[str]
    runs: Counter[str]
    repeats: Counter[str]


def count_effects(results: Blobs | ContainerClient) -> Effects:
    """The effects in the results container (the port's, or an SDK client of the host's tests)."""
    applied: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    repeats: Counter[str] = Counter()
    if isinstance(results, ContainerClient):
        names = [blob.name for blob in results.list_blobs()]
    else:
        names = [blob.name for page in results.pages() for blob in page]
    for name in names:
        parts = name.split("/")  # a job of a queue other than the default is `<queue>/<id>`
        if parts[0] == "effects" and len(parts) in (2, 3):
            applied["/".join(parts[1:]).removesuffix(".json")] += 1
        elif parts[0] == "runs":
            runs["/".join(parts[1:-1])] += 1
        elif parts[0] == "repeats":
            repeats["/".join(parts[1:-1])] += 1
    return Effects(applied, runs, repeats)
