"""The console's indexes: the pure parts (keys, entities, filters, pages)."""

from __future__ import annotations

from typing import Any

from shared.core.envelope import utcnow
from shared.indexes.entry_rows import EntryState
from shared.indexes.entry_rows import entity_of as entry_entity
from shared.indexes.jobs import IndexedStore, entity_of, query_filter, should_index
from shared.indexes.keys import day_of, decode_token, encode_token, newest_first, quoted, table_prefix
from shared.poison.entry import ArchiveEntry
from shared.storage.failures import StorageBusy
from shared.storage.memory_documents import MemoryDocuments


def test_row_keys_sort_newer_first_and_are_safe_in_table_keys() -> None:
    older = newest_first("2026-01-01T00:00:00Z", "jobs/a/1.json")
    newer = newest_first("2026-01-02T00:00:00Z", "jobs/a/1.json")
    assert newer < older
    assert "/" not in older and "#" not in newest_first("", "a#b?c\\d")
    assert day_of("2026-03-04T23:59:59+00:00") == "20260304" and day_of(None) == "19700101"


def test_filters_quote_values_and_table_names_are_letters_and_digits() -> None:
    assert quoted("it's") == "'it''s'"
    where = query_filter(status="poisoned", kind="noop", reason_code="bad_input_data", id_prefix="job-1")
    assert where == (
        "PartitionKey eq 'j' and status eq 'poisoned' and kind eq 'noop' and reason_code eq 'bad_input_data'"
        " and id ge 'job-1' and id lt 'job-1~'"
    )
    assert table_prefix("job-ledger") == "jobledger" and table_prefix("1st-ledger") == "t1stledger"
    assert decode_token(encode_token({"day": "20260101"})) == {"day": "20260101"}
    assert decode_token("not a token!") is None


def test_a_claim_is_not_indexed_and_every_other_write_is() -> None:
    assert not should_index({"id": "a", "status": "in_progress"})
    assert should_index({"id": "a", "status": "completed"})
    entity = entity_of(
        {"id": "a", "status": "poisoned", "kind": "noop", "reason_code": "x", "reason": "r" * 999}
    )
    assert entity["PartitionKey"] == "j" and entity["RowKey"].endswith("_a") and len(entity["reason"]) == 256


def test_an_entry_keeps_its_index_key_across_changes_of_state() -> None:
    entry = ArchiveEntry.parse({"state": "poisoned", "archived_at": "2026-01-01T00:00:00Z", "job_id": "a"})
    key = entry.key("jobs/a/1.json")
    later = ArchiveEntry.parse(
        {**entry.to_data(), "state": "parked", "archived_at": "2026-02-01T00:00:00Z", "index_key": key}
    )
    assert entry_entity(later.row("jobs/a/1.json")) == {
        **entry_entity(later.row("jobs/a/1.json")),
        "RowKey": key,
    }
    assert entry_entity(later.row("jobs/a/1.json"))["PartitionKey"] == "parked"
    moved = entry.moved("jobs/a/1.json", EntryState.PARKED, utcnow())
    assert moved.row("jobs/a/1.json").key == key and moved.index_key == key


class FakeIndex:
    def __init__(self, fail: bool = False) -> None:
        self.put_ids: list[str] = []
        self.fail = fail

    def put(self, data: dict[str, Any]) -> None:
        if self.fail:
            raise StorageBusy("indexing: storage busy (ServiceRequestError)", answered=False)
        self.put_ids.append(f"{data['id']}:{data['status']}")


def test_the_indexed_ledger_store_writes_the_index_after_the_record_and_never_fails_for_it() -> None:
    index = FakeIndex()
    store = IndexedStore(MemoryDocuments(utcnow), index)  # type: ignore[arg-type]
    doc = store.create("a.json", {"id": "a", "status": "in_progress"})
    store.replace("a.json", doc, {"id": "a", "status": "completed"})
    assert index.put_ids == ["a:completed"]
    broken = IndexedStore(MemoryDocuments(utcnow), FakeIndex(fail=True))  # type: ignore[arg-type]
    assert broken.create("b.json", {"id": "b", "status": "queued"}).data["status"] == "queued"


def test_a_running_jobs_page_refreshes_itself_and_offers_cancel() -> None:
    from shared.interfaces.console import pages
    from shared.interfaces.console.queries import JobView

    def page(status: str) -> str:
        view = JobView({"status": status, "kind": "noop"}, [], None, None, None, "", [])
        return pages.job_page(view, "/api/console", "j1")

    assert "id=live data-running=1" in page("in_progress") and "data-do=cancel-job" in page("offloaded")
    assert "id=live" not in page("completed") and "cancel-job" not in page("poisoned")


def test_a_completed_jobs_page_names_its_data_output() -> None:
    from shared.interfaces.console import pages
    from shared.interfaces.console.queries import JobView

    def page(summary: dict[str, object]) -> str:
        view = JobView(
            {"status": "completed", "kind": "aggregate", "summary": summary}, [], None, None, None, "", []
        )
        return pages.job_page(view, "/api/console", "j1")

    output = {"format": "parquet", "result_ref": "results/j1.v0.<x>.parquet", "bytes": 1234}
    shown = page({"groups": 3, "output": output})
    assert (
        "<p id=result-data>the rows, as parquet: <code>results/j1.v0.&lt;x&gt;.parquet</code> (1234 bytes"
        in shown
    )
    assert "result-data" not in page({"groups": 3})  # a JSON result: the document holds the rows


def test_an_export_is_csv_with_a_header_and_the_next_key() -> None:
    from shared.interfaces.console.queries import as_csv

    text = as_csv([{"name": "jobs/a/1.json", "state": "poisoned", "job_id": "a", "reason": 'say "x", y',
                    "archived_at": "t", "attempts": 5, "body_bytes": 9, "key": "k1"}])  # fmt: skip
    lines = text.splitlines()
    assert lines[0] == "name,state,job_id,reason,archived_at,attempts,body_bytes,key"
    assert lines[1] == 'jobs/a/1.json,poisoned,a,"say ""x"", y",t,5,9,k1'
