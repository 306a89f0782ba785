"""Issue 36: the queue sample's pure parts, and the Spark slots' `since` (the oldest run's age)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shared.observability.queue_metrics import oldest_age
from shared.spark.slots import Slots
from shared.storage.memory_documents import MemoryDocuments


def test_oldest_age_is_the_oldest_peeked_message_or_zero() -> None:
    now = datetime(2026, 11, 28, 5, 0, tzinfo=UTC)
    assert oldest_age([], now) == 0.0
    assert oldest_age([None], now) == 0.0
    assert oldest_age([now - timedelta(seconds=90), now - timedelta(seconds=30)], now) == 90.0
    assert oldest_age([now + timedelta(seconds=5)], now) == 0.0  # clock skew: never negative


def test_a_slot_keeps_when_its_holder_took_it_across_renewals() -> None:
    clock = [1000.0]
    slots = Slots(MemoryDocuments(lambda: datetime.now(UTC)), cap=2, lease_s=60, clock=lambda: clock[0])
    index = slots.acquire("job-a")
    assert index is not None
    clock[0] = 1030.0
    assert slots.renew("job-a", index)
    assert slots.acquire("job-b") is not None
    assert sorted(slots.held_since()) == [1000.0, 1030.0]
    slots.release("job-a", index)
    assert slots.held_since() == [1030.0]
    clock[0] = 2000.0  # job-b's lease lapsed: not in flight any more
    assert slots.held_since() == []
