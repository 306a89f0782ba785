"""Table clients that threads can share (shared/storage/tables.py): no I/O, clients are only built."""

from __future__ import annotations

from typing import Any, cast

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient, TableServiceClient

from shared.config.settings import StorageConnection
from shared.storage.tables import KEPT_TABLE_CLIENTS, AzureTable, TableService, query_rows, table_service

CONN = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
    "TableEndpoint=http://127.0.0.1:1/devstoreaccount1;"
)


def chain(client: TableClient) -> list[Any]:
    """The policy objects a request on `client` passes through, in order."""
    policies: list[Any] = []
    node: Any = client._client._client._pipeline._impl_policies[0]
    while hasattr(node, "next"):
        policies.append(node)
        node = node.next
    return policies


def test_the_service_is_the_thread_safe_one() -> None:
    assert isinstance(table_service(StorageConnection(connection_string=CONN)), TableService)


def test_table_clients_share_no_policy_object_and_building_one_leaves_the_others_linked() -> None:
    service = table_service(StorageConnection(connection_string=CONN))
    first = service.get_table_client("first")
    before = [(id(p), id(p.next)) for p in chain(first)]
    second = service.get_table_client("second")
    assert len(before) > 3
    assert not {id(p) for p in chain(first)} & {id(p) for p in chain(second)}
    assert [(id(p), id(p.next)) for p in chain(first)] == before, (
        "building a client relinked another's policies"
    )


def test_the_sdk_service_client_relinks_shared_policies_which_is_why_tables_py_builds_its_own() -> None:
    """The hazard guarded against: with the SDK's own `get_table_client`, two table clients share
    policy objects, and building the second repoints the first's chain mid-flight."""
    from azure.data.tables import TableServiceClient

    service = TableServiceClient.from_connection_string(CONN)
    first = service.get_table_client("first")
    second = service.get_table_client("second")
    assert {id(p) for p in chain(first)} & {id(p) for p in chain(second)}


def test_a_table_client_is_built_once_per_name_and_old_ones_are_let_go() -> None:
    service = table_service(StorageConnection(connection_string=CONN))
    assert service.get_table_client("jobs") is service.get_table_client(table_name="jobs")
    for i in range(KEPT_TABLE_CLIENTS + 5):
        service.get_table_client(f"day{i}")
    assert len(service.kept()) == KEPT_TABLE_CLIENTS
    assert "jobs" not in service.kept()
    assert service.get_table_client("jobs").table_name == "jobs"


class _Pages:
    """What `query_entities(...).by_page(token)` gives: one page, and the token after it."""

    def __init__(self, pages: list[list[dict[str, Any]]], start: int) -> None:
        self._page = pages[start] if start < len(pages) else []
        self.continuation_token = start + 1 if start + 1 < len(pages) else None
        self._given = False

    def __next__(self) -> list[dict[str, Any]]:
        if self._given:
            raise StopIteration
        self._given = True
        return self._page

    def __iter__(self) -> _Pages:
        return self


class _Table:
    """A table whose service answers in the given (possibly short) pages; counts its queries."""

    def __init__(self, pages: list[list[dict[str, Any]]], missing: bool = False) -> None:
        self.pages, self.missing, self.queries = pages, missing, 0

    def query_entities(self, where: str, results_per_page: int, select: Any = None) -> Any:
        table = self

        class _Query:
            def by_page(self, continuation_token: Any = None) -> _Pages:
                if table.missing:
                    raise ResourceNotFoundError("TableNotFound")
                table.queries += 1
                return _Pages(table.pages, continuation_token or 0)

        return _Query()


class _Service:
    def __init__(self, table: _Table) -> None:
        self.table = table

    def get_table_client(self, name: str) -> _Table:
        return self.table


def port(table: _Table) -> AzureTable:
    """The `Table` port on the fake client."""
    return AzureTable(cast(TableServiceClient, _Service(table)), "t")


def rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"RowKey": f"{i:04d}"} for i in range(start, start + n)]


def test_query_rows_takes_one_query_when_the_first_page_is_full() -> None:
    table = _Table([rows(5), rows(5, 5)])
    got = query_rows(port(table), "x", 5, 8)
    assert [r["RowKey"] for r in got] == [f"{i:04d}" for i in range(5)] and table.queries == 1


def test_query_rows_follows_short_pages_up_to_its_limit() -> None:
    table = _Table([rows(2), [], rows(2, 2), rows(3, 4)])
    assert [r["RowKey"] for r in query_rows(port(table), "x", 5, 8)] == [f"{i:04d}" for i in range(5)]
    assert table.queries == 4
    capped = _Table([rows(1), rows(1, 1), rows(1, 2), rows(1, 3)])
    assert len(query_rows(port(capped), "x", 5, 2)) == 2 and capped.queries == 2


def test_query_rows_of_a_missing_table_is_empty() -> None:
    assert query_rows(port(_Table([], missing=True)), "x", 5, 8) == []
