"""A job's archive entries and edit, found by the names its record keeps (pure): shared/interfaces/console/job_archive.py."""

from __future__ import annotations

from datetime import UTC, datetime

from shared import ledger
from shared.core.envelope import body_digest
from shared.interfaces.console.job_archive import ArchivePlan, plan
from shared.ledger import Facts
from shared.ledger import operator as ledger_operator

FACTS = Facts(datetime(2026, 11, 24, 12, 30, tzinfo=UTC))


def test_each_poisoning_names_its_body_newest_first_in_the_same_write() -> None:
    first = ledger.poisoned(None, "j1", FACTS, "bad", "x", b"a")
    again = ledger.poisoned({**first, "status": "queued"}, "j1", FACTS, "bad", "x", b"b")
    assert again[ledger.POISON_DIGESTS] == [body_digest(b"b"), body_digest(b"a")]
    assert ledger.POISON_DIGESTS_PARTIAL not in again
    same = ledger.poisoned(again, "j1", FACTS, "bad", "x", b"a")
    assert same[ledger.POISON_DIGESTS] == [body_digest(b"a"), body_digest(b"b")], "moved to the front"
    assert plan("j1", same) == ArchivePlan(
        entries=(f"jobs/j1/{body_digest(b'a')}.json", f"jobs/j1/{body_digest(b'b')}.json")
    )


def test_a_record_of_before_or_past_the_kept_digests_is_listed() -> None:
    legacy = {"id": "j1", "status": "poisoned", "poisoned_at": "t", "body_digest": "d"}
    assert plan("j1", legacy) == ArchivePlan(list_entries=True)
    after = ledger.poisoned({**legacy, "status": "queued"}, "j1", FACTS, "bad", "x", b"a")
    assert after[ledger.POISON_DIGESTS_PARTIAL] is True and plan("j1", after).list_entries
    data: dict[str, object] | None = None
    for i in range(ledger.POISON_DIGESTS_KEEP + 1):
        data = ledger.poisoned(data, "j2", FACTS, "bad", "x", str(i).encode())
    assert data is not None and len(data[ledger.POISON_DIGESTS]) == ledger.POISON_DIGESTS_KEEP  # type: ignore[arg-type]
    assert plan("j2", data).list_entries
    assert plan("j3", {"id": "j3", "status": "completed", "history": []}) == ArchivePlan(), "nothing to read"
    assert plan("j4", {"id": "j4", "replay_count": 1}).list_entries, "recreated by a replay: listed"


def test_an_edit_is_named_by_the_replay_write_and_a_record_of_before_lists_edits() -> None:
    poisoned = ledger.poisoned(None, "j1", FACTS, "bad", "x", b"a")
    edited = ledger_operator.edited(poisoned, "j1", FACTS, "ann", ["payload.x"], "e" * 64)
    assert plan("j1", edited).edit == f"edits/j1/{'e' * 64}.json" and not plan("j1", edited).list_edits
    legacy = {k: v for k, v in edited.items() if k != "last_edit_digest"}
    assert plan("j1", legacy).list_edits and plan("j1", legacy).edit is None


def test_damaged_names_fall_back_to_the_listing_and_never_crash() -> None:
    """A record whose names are not what the app writes (not a list, not strings, empty) is
    treated as a record of before: its entries and edits are listed, and the next poisoning starts
    a partial list, so an entry archived before is still found."""
    base = {"id": "j1", "status": "poisoned", "poisoned_at": "t", "edit_count": 1}
    for damaged in ("abc", {"d": 1}, [1, 2], [""], ["ok", None], []):
        record = {**base, ledger.POISON_DIGESTS: damaged, "last_edit_digest": 7}
        assert plan("j1", record) == ArchivePlan(list_entries=True, list_edits=True), damaged
        after = ledger.poisoned({**record, "status": "queued"}, "j1", FACTS, "bad", "x", b"a")
        assert after[ledger.POISON_DIGESTS] == [body_digest(b"a")], damaged
        assert after[ledger.POISON_DIGESTS_PARTIAL] is True and plan("j1", after).list_entries, damaged


def test_a_record_recreated_by_a_replay_and_poisoned_again_still_lists_the_earlier_entry() -> None:
    """A replay of an archive entry whose record was gone writes a record without names; its entry
    is under the job, so the next poisoning keeps the list partial (listed), not named alone."""
    recreated = {"id": "j5", "status": "queued", "replay_count": 1, "history": [{"event": "replayed"}]}
    after = ledger.poisoned(recreated, "j5", FACTS, "bad", "x", b"a")
    assert after[ledger.POISON_DIGESTS_PARTIAL] is True and plan("j5", after).list_entries
    fresh = ledger.poisoned({"id": "j6", "status": "queued", "history": []}, "j6", FACTS, "bad", "x", b"a")
    assert ledger.POISON_DIGESTS_PARTIAL not in fresh and not plan("j6", fresh).list_entries
