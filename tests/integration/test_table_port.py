"""The `Tables` port (shared/storage/ports.py) answers the same on its two implementations:
`MemoryTables` (the simulation's and the logic tests', in `make test-fast`) and `AzureTables` on
Azurite (in `make test`): the in-memory tables cannot drift from the service without one of these
failing on one side.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from devstack.azurite import Azurite
from shared.config.settings import Settings
from shared.storage.failures import AlreadyExists, ConditionFailed, NotFound, StorageError
from shared.storage.memory_tables import MemoryTables
from shared.storage.ports import TableOp, Tables, in_transactions
from shared.storage.tables import AzureTables, table_service
from tests.integration.helpers import unique
from tests.storage_params import STORAGE_BACKENDS


@pytest.fixture(params=STORAGE_BACKENDS)
def tables(request: pytest.FixtureRequest) -> Tables:
    if request.param == "azurite":
        azurite: Azurite = request.getfixturevalue("azurite")
        settings = Settings.from_env({"AzureWebJobsStorage": azurite.connection_string})
        return AzureTables(table_service(settings.storage))
    return MemoryTables()


@pytest.fixture
def name(tables: Tables) -> str:
    made = unique("port").replace("-", "")
    tables.table(made).create()
    return made


def test_entity_writes_and_their_conditions(tables: Tables, name: str) -> None:
    table = tables.table(name)
    table.create()  # there already: no error
    with pytest.raises(NotFound):
        tables.table(unique("notable").replace("-", "")).upsert({"PartitionKey": "p", "RowKey": "r"})
    assert table.get("p", "r") is None
    made = table.insert({"PartitionKey": "p", "RowKey": "r", "n": 1, "s": "x"})
    with pytest.raises(AlreadyExists):
        table.insert({"PartitionKey": "p", "RowKey": "r", "n": 2})
    got = table.get("p", "r")
    assert got is not None and dict(got) == {"PartitionKey": "p", "RowKey": "r", "n": 1, "s": "x"}
    assert got.etag == made
    done = table.update({"PartitionKey": "p", "RowKey": "r", "n": 2}, made)
    with pytest.raises(ConditionFailed) as stale:
        table.update({"PartitionKey": "p", "RowKey": "r", "n": 3}, made)
    assert stale.value.status_code == 412
    again = table.get("p", "r")
    assert (
        again is not None
        and dict(again) == {"PartitionKey": "p", "RowKey": "r", "n": 2}
        and again.etag == done
    )
    table.upsert({"PartitionKey": "p", "RowKey": "r", "m": 5})  # replaces the entity whole
    replaced = table.get("p", "r")
    assert replaced is not None and dict(replaced) == {"PartitionKey": "p", "RowKey": "r", "m": 5}
    with pytest.raises(ConditionFailed):
        table.delete("p", "r", made)
    table.delete("p", "none")  # missing: no error (as the SDK answers it)
    table.delete("p", "r")
    assert table.get("p", "r") is None
    with pytest.raises(TypeError):
        table.upsert({"PartitionKey": "p", "RowKey": "big", "n": 2**40})  # ints are Int32


def test_queries_page_with_continuation_tokens(tables: Tables, name: str) -> None:
    table = tables.table(name)
    for i in range(5):
        table.upsert({"PartitionKey": "q", "RowKey": f"k{i}", "v": str(i), "even": i % 2 == 0})
    table.upsert({"PartitionKey": "z", "RowKey": "k0", "v": "other"})
    seen: list[str] = []
    pages = 0
    cont = None
    while True:
        page = table.query("PartitionKey eq 'q'", size=2, continuation=cont)
        pages += 1
        seen.extend(r["RowKey"] for r in page.rows)
        cont = page.continuation
        if not cont:
            break
    assert seen == ["k0", "k1", "k2", "k3", "k4"] and pages == 3
    ranged = table.rows("PartitionKey eq 'q' and RowKey gt 'k1' and RowKey lt 'k4' and v ne '3'")
    assert [r["RowKey"] for r in ranged] == ["k2"]
    assert [dict(r) for r in table.rows("PartitionKey eq 'z'", select=["v"])] == [{"v": "other"}]
    assert all(r.etag for r in table.rows("PartitionKey eq 'q'", size=2))
    with pytest.raises(NotFound):
        list(tables.table(unique("notable").replace("-", "")).rows("PartitionKey eq 'q'"))
    prefix = name[:-3]
    assert name in tables.names(f"TableName ge '{prefix}' and TableName lt '{prefix}~'")


def test_a_transaction_is_all_or_nothing(tables: Tables, name: str) -> None:
    table = tables.table(name)
    table.upsert({"PartitionKey": "t", "RowKey": "a", "n": 1})
    etag = table.get("t", "a")
    assert etag is not None
    answers = table.transact(
        [
            TableOp("upsert", {"PartitionKey": "t", "RowKey": "b", "n": 2}),
            TableOp("create", {"PartitionKey": "t", "RowKey": "c", "n": 3}),
            TableOp("delete", {"PartitionKey": "t", "RowKey": "a"}, etag.etag),
        ]
    )
    assert len(answers) == 3 and answers[0] and answers[1] and answers[2] is None
    with pytest.raises(StorageError) as failed:
        table.transact(
            [
                TableOp("upsert", {"PartitionKey": "t", "RowKey": "d", "n": 4}),
                TableOp("delete", {"PartitionKey": "t", "RowKey": "none"}),
            ]
        )
    assert failed.value.status_code == 404
    assert sorted(r["RowKey"] for r in table.rows("PartitionKey eq 't'")) == ["b", "c"], (
        "nothing of it applied"
    )


def test_operations_of_a_failed_transaction_are_done_one_by_one(tables: Tables, name: str) -> None:
    """`in_transactions`: 100 operations a transaction; one that fails goes operation by operation."""
    table = tables.table(name)
    ops = [TableOp("upsert", {"PartitionKey": "c", "RowKey": f"r{i:03d}"}) for i in range(150)]
    alone: list[str] = []
    assert in_transactions(table, ops, lambda op: alone.append(str(op.entity["RowKey"]))) == 2
    assert alone == [] and len(list(table.rows("PartitionKey eq 'c'"))) == 150
    missing = tables.table(unique("notable").replace("-", ""))
    assert in_transactions(missing, ops[:3], lambda op: alone.append(str(op.entity["RowKey"]))) == 4
    assert alone == ["r000", "r001", "r002"]


def test_a_dropped_table_is_gone_with_its_entities(tables: Tables, name: str) -> None:
    table = tables.table(name)
    table.upsert({"PartitionKey": "p", "RowKey": "r"})
    kept = unique("port").replace("-", "")
    tables.table(kept).create()
    table.drop()
    names = set(tables.names("TableName ge 'port' and TableName lt 'port~'"))
    assert name not in names and kept in names
    with pytest.raises(NotFound):
        list(table.rows("PartitionKey eq 'p'"))
    assert table.get("p", "r") is None
    table.drop()  # gone already: no error


def test_rows_are_filtered_by_their_write_timestamp(tables: Tables, name: str) -> None:
    """The entry index's retention query: the service's `Timestamp` of a row's last write."""
    table = tables.table(name)
    table.upsert({"PartitionKey": "p", "RowKey": "a"})
    table.upsert({"PartitionKey": "p", "RowKey": "b"})
    written = datetime.now(UTC)

    def stamp(moment: datetime) -> str:
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    after, before = stamp(written + timedelta(hours=1)), stamp(written - timedelta(hours=1))
    found = table.rows(f"PartitionKey eq 'p' and RowKey ge 'b' and Timestamp lt datetime'{after}'")
    assert [r["RowKey"] for r in found] == ["b"]
    assert list(table.rows(f"PartitionKey eq 'p' and Timestamp lt datetime'{before}'")) == []
    assert len(list(table.rows(f"PartitionKey eq 'p' and Timestamp ge datetime'{before}'"))) == 2
