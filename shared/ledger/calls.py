"""A job's downstream calls, as its ledger record keeps them (pure).

`downstream`: the newest `DOWNSTREAM_KEEP` notes of the calls the job's runs made through the app's
HTTP client with `record=True` (shared/net/client.py), each `{"attempt", "at", "status" | "error",
"ms"}` (and `"replay"`, the record's replay count, once the job was replayed). The notes of one
attempt go into the ledger write that ends it (completed, retry scheduled, poisoned, released,
continued): no storage request more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from shared.core.envelope import isoformat

DOWNSTREAM = "downstream"
DOWNSTREAM_KEEP = 20


def downstream_of(data: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The record's call notes, oldest first (a damaged field reads as none)."""
    raw = (data or {}).get(DOWNSTREAM)
    if not isinstance(raw, list):
        return []
    return [dict(n) for n in raw if isinstance(n, Mapping)]


def calls_noted(
    prev: dict[str, Any] | None, attempt: int, notes: Sequence[Mapping[str, Any]], now: datetime
) -> dict[str, Any] | None:
    """`prev` with one attempt's call notes added to `downstream`, the newest kept (unchanged
    when there are none, or no record)."""
    if not notes or prev is None:
        return prev
    replay = prev.get("replay_count")
    stamp: dict[str, Any] = {"attempt": attempt, "at": isoformat(now)}
    if isinstance(replay, int) and not isinstance(replay, bool) and replay > 0:
        stamp["replay"] = replay
    added = [{**stamp, **{k: v for k, v in n.items() if k in ("status", "error", "ms")}} for n in notes]
    known = downstream_of(prev)
    if known[-len(added) :] == added:  # a write of ours that landed unanswered already has them
        return prev
    data = dict(prev)
    data[DOWNSTREAM] = [*known, *added][-DOWNSTREAM_KEEP:]
    return data
