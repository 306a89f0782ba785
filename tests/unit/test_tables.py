"""Table clients that threads can share (shared/tables.py): no I/O, clients are only built."""

from __future__ import annotations

from typing import Any

from azure.data.tables import TableClient

from shared.settings import StorageConnection
from shared.tables import KEPT_TABLE_CLIENTS, TableService, table_service

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
    assert len(service._tables) == KEPT_TABLE_CLIENTS
    assert "jobs" not in service._tables
    assert service.get_table_client("jobs").table_name == "jobs"
