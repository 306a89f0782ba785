"""Tables in memory: what azure-data-tables' clients do for the app (OData filters joined by `and`,
pages with continuation tokens, entity group transactions, the SDK's value and key rules)."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, cast

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError
from azure.core.paging import ItemPaged
from azure.data.tables import EdmType, TableEntity, TableItem, TableTransactionError, UpdateMode
from azure.data.tables._error import (
    _ERROR_TYPE_NOT_SUPPORTED,
    _ERROR_VALUE_TOO_LARGE,
    _validate_storage_tablename,
)
from azure.data.tables._serialize import _get_match_condition

from tests.fakes.storage.common import (
    FORBIDDEN_KEY,
    MAX_KEY_CHARS,
    MAX_PROPERTIES,
    MAX_STRING_CHARS,
    TABLE_PAGE,
    TRANSACTION_LIMIT,
    ErrorResponse,
    refuse_unknown,
    same_page,
    table_error,
    whole_seconds,
)

if TYPE_CHECKING:
    from tests.fakes.storage.account import MemoryStorage


@dataclass(frozen=True)
class EntityRecord:
    props: dict[str, Any]
    etag: str
    timestamp: datetime


@dataclass
class TableRecord:
    name: str
    entities: dict[tuple[str, str], EntityRecord] = field(default_factory=dict)


# -- tables -------------------------------------------------------------------------------------


class _Refused(Exception):
    """An entity operation the service refuses: its status, code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def error(self) -> HttpResponseError:
        return table_error(self.status, self.code, self.message)


def _stored(entity: Mapping[str, Any]) -> dict[str, Any]:
    """An entity's properties as the SDK sends them (None left out) and the service keeps them."""
    pk, rk = entity.get("PartitionKey"), entity.get("RowKey")
    if pk is None:
        raise ValueError("PartitionKey must be present in an entity")
    if rk is None:
        raise ValueError("RowKey must be present in an entity")
    out: dict[str, Any] = {}
    for name, value in entity.items():
        if value is None:
            continue
        kind = type(value)
        if kind is int:
            if not -(2**31) <= value < 2**31:
                raise TypeError(_ERROR_VALUE_TOO_LARGE.format(str(value), EdmType.INT32))
        elif kind not in (str, bool, float, bytes, datetime):
            raise TypeError(_ERROR_TYPE_NOT_SUPPORTED.format(type(value)))
        out[name] = value
    for key in (pk, rk):
        if not isinstance(key, str) or len(key) > MAX_KEY_CHARS or FORBIDDEN_KEY.search(key):
            raise _Refused(400, "OutOfRangeInput", "One of the request inputs is out of range.")
    if len(out) > MAX_PROPERTIES:
        raise _Refused(400, "TooManyProperties", "The entity contains more properties than allowed.")
    if any(isinstance(v, str) and len(v) > MAX_STRING_CHARS for v in out.values()):
        raise _Refused(
            400, "PropertyValueTooLarge", "The property value exceeds the maximum allowed size (64KB)."
        )
    return out


def _entity_path(table: str, pk: str, rk: str) -> str:
    return f"{table}(PartitionKey='{pk}',RowKey='{rk}')"


class _Filter:
    """An OData filter of comparisons joined by `and` (what the app sends), evaluated on a row."""

    TOKEN = re.compile(
        r"\s*(?:datetime(?P<datetime>'[^']*')|(?P<string>'(?:[^']|'')*')|(?P<number>-?\d+)(?![\w.])|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<other>\S))"
    )
    OPS: dict[str, Callable[[Any, Any], bool]] = {
        "eq": lambda a, b: bool(a == b),
        "ne": lambda a, b: bool(a != b),
        "gt": lambda a, b: bool(a > b),
        "ge": lambda a, b: bool(a >= b),
        "lt": lambda a, b: bool(a < b),
        "le": lambda a, b: bool(a <= b),
    }

    def __init__(self, text: str) -> None:
        self.text = text
        tokens: list[tuple[str, Any]] = []
        for found in self.TOKEN.finditer(text):
            if found.group("datetime") is not None:
                try:
                    moment = datetime.fromisoformat(found.group("datetime")[1:-1].replace("Z", "+00:00"))
                except ValueError:
                    self._refuse()
                tokens.append(("value", moment))
            elif found.group("string") is not None:
                tokens.append(("value", found.group("string")[1:-1].replace("''", "'")))
            elif found.group("number") is not None:
                tokens.append(("value", int(found.group("number"))))
            elif found.group("word") is not None:
                word = found.group("word")
                if word in ("true", "false"):
                    tokens.append(("value", word == "true"))
                else:
                    tokens.append(("word", word))
            else:
                self._refuse()
        groups: list[list[tuple[str, Any]]] = [[]]
        for token in tokens:
            if token == ("word", "and"):
                groups.append([])
            else:
                groups[-1].append(token)
        self.terms: list[tuple[str, str, Any]] = []
        for group in groups:
            kinds = [kind for kind, _ in group]
            if kinds != ["word", "word", "value"] or group[1][1] not in self.OPS:
                self._refuse()
            self.terms.append((group[0][1], group[1][1], group[2][1]))

    def _refuse(self) -> NoReturn:
        raise NotImplementedError(f"OData filter not understood by the in-memory account: {self.text!r}")

    def holds(self, row: Mapping[str, Any]) -> bool:
        for name, op, value in self.terms:
            have = row.get(name)
            comparable = have is not None and (
                type(have) is type(value) or (type(have) in (int, float) and type(value) in (int, float))
            )
            if not comparable or not self.OPS[op](have, value):
                return False
        return True


class MemoryTableClient:
    """One table of a `MemoryStorage` (azure-data-tables' `TableClient`, as the app uses it)."""

    def __init__(self, account: MemoryStorage, name: str) -> None:
        self.account = account
        self.table_name = name
        self.url = account.url(name)

    def _table(self) -> TableRecord:
        found = self.account.tables.get(self.table_name.lower())
        if found is None:
            raise _Refused(404, "TableNotFound", "The table specified does not exist.")
        return found

    def _etag(self, now: datetime) -> str:
        return f"W/\"datetime'{now.strftime('%Y-%m-%dT%H%%3A%M%%3A%S')}.{self.account.next_seq():07d}Z'\""

    def _out(self, entity: EntityRecord, select: Iterable[str] | None = None) -> TableEntity:
        props = entity.props if select is None else {k: entity.props[k] for k in select if k in entity.props}
        out = TableEntity(copy.deepcopy(props))
        out._metadata = {"etag": entity.etag, "timestamp": entity.timestamp}
        return out

    def _apply(
        self,
        entities: dict[tuple[str, str], EntityRecord],
        operation: str,
        entity: Mapping[str, Any],
        options: Mapping[str, Any],
    ) -> dict[str, Any]:
        """One entity operation on `entities` (a table's, or a transaction's copy); its answer."""
        props = _stored(entity) if operation != "delete" else dict(entity)
        key = (str(props["PartitionKey"]), str(props["RowKey"]))
        current = entities.get(key)
        now = self.account.clock()
        if operation == "create":
            if current is not None:
                raise _Refused(409, "EntityAlreadyExists", "The specified entity already exists.")
        elif operation in ("update", "delete"):
            condition = _get_match_condition(  # type: ignore[no-untyped-call]
                etag=options.get("etag"),
                match_condition=options.get("match_condition") or MatchConditions.Unconditionally,
            )
            if current is None:
                raise _Refused(404, "ResourceNotFound", "The specified resource does not exist.")
            if condition == MatchConditions.IfNotModified and options.get("etag") != current.etag:
                raise _Refused(
                    412,
                    "UpdateConditionNotSatisfied",
                    "The update condition specified in the request was not satisfied.",
                )
            if operation == "delete":
                del entities[key]
                return {}
        elif operation != "upsert":
            raise ValueError(f"unknown transaction operation {operation!r}")
        mode = options.get("mode", UpdateMode.MERGE)
        if mode == UpdateMode.MERGE and current is not None and operation != "create":
            props = {**current.props, **props}
        entities[key] = EntityRecord(props, self._etag(now), now)
        return {"etag": entities[key].etag, "date": whole_seconds(now), "version": "2019-02-02"}

    def _one(
        self, method: str, operation: str, entity: Mapping[str, Any], options: Mapping[str, Any]
    ) -> dict[str, Any]:
        with self.account.lock:
            pk, rk = entity.get("PartitionKey"), entity.get("RowKey")
            self.account.log(method, _entity_path(self.table_name, str(pk), str(rk)))
            try:
                return self._apply(self._table().entities, operation, entity, options)
            except _Refused as refused:
                raise refused.error() from None

    def create_entity(self, entity: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "create_entity")
        with self.account.lock:
            self.account.log("POST", self.table_name)
            try:
                return self._apply(self._table().entities, "create", entity, {})
            except _Refused as refused:
                raise refused.error() from None

    def upsert_entity(
        self, entity: Mapping[str, Any], mode: UpdateMode = UpdateMode.MERGE, **kwargs: Any
    ) -> dict[str, Any]:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "upsert_entity")
        return self._one("PUT" if mode == UpdateMode.REPLACE else "MERGE", "upsert", entity, {"mode": mode})

    def update_entity(
        self,
        entity: Mapping[str, Any],
        mode: UpdateMode = UpdateMode.MERGE,
        *,
        etag: str | None = None,
        match_condition: MatchConditions | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "update_entity")
        if match_condition and not etag and isinstance(entity, TableEntity):
            etag = entity.metadata.get("etag")
        options = {"mode": mode, "etag": etag, "match_condition": match_condition}
        return self._one("PUT" if mode == UpdateMode.REPLACE else "MERGE", "update", entity, options)

    def delete_entity(self, *args: Any, **kwargs: Any) -> None:
        entity = kwargs.pop("entity", None) or (args[0] if args and isinstance(args[0], Mapping) else None)
        if entity is not None:
            pk, rk = entity["PartitionKey"], entity["RowKey"]
        else:
            pk = kwargs.pop("partition_key", None) or args[0]
            rk = kwargs.pop("row_key", None) or args[1]
        etag = kwargs.pop("etag", None)
        match_condition = kwargs.pop("match_condition", None)
        if match_condition and entity is not None and not etag and isinstance(entity, TableEntity):
            etag = entity.metadata.get("etag")
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "delete_entity")
        options = {"etag": etag, "match_condition": match_condition}
        try:
            self._one("DELETE", "delete", {"PartitionKey": pk, "RowKey": rk}, options)
        except HttpResponseError as exc:
            if exc.status_code != 404:  # the SDK answers a missing entity (or table) with nothing
                raise

    def get_entity(
        self, partition_key: str, row_key: str, *, select: str | list[str] | None = None, **kwargs: Any
    ) -> TableEntity:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "get_entity")
        with self.account.lock:
            self.account.log("GET", _entity_path(self.table_name, partition_key, row_key))
            try:
                found = self._table().entities.get((partition_key, row_key))
            except _Refused as refused:
                raise refused.error() from None
            if found is None:
                raise table_error(404, "ResourceNotFound", "The specified resource does not exist.")
            return self._out(found, [select] if isinstance(select, str) else select)

    def query_entities(
        self,
        query_filter: str,
        *,
        select: str | list[str] | None = None,
        results_per_page: int | None = None,
        **kwargs: Any,
    ) -> ItemPaged[TableEntity]:
        kwargs.pop("timeout", None)
        if kwargs.pop("parameters", None):
            raise NotImplementedError("query_entities(parameters=...)")
        refuse_unknown(kwargs, "query_entities")
        where = _Filter(query_filter)
        size = min(results_per_page or TABLE_PAGE, TABLE_PAGE)
        fields = [s.strip() for s in select.split(",")] if isinstance(select, str) else select

        def page(token: Mapping[str, str] | None) -> tuple[dict[str, str] | None, list[TableEntity]]:
            with self.account.lock:
                self.account.log("GET", f"{self.table_name}()")
                try:
                    entities = self._table().entities
                except _Refused as refused:
                    raise refused.error() from None
                start = (token["PartitionKey"], token["RowKey"]) if token else None
                keys = sorted(
                    k
                    for k, e in entities.items()
                    if (start is None or k >= start) and where.holds({**e.props, "Timestamp": e.timestamp})
                )
                items = [self._out(entities[k], fields) for k in keys[:size]]
                following = keys[size] if len(keys) > size else None
                token_out = {"PartitionKey": following[0], "RowKey": following[1]} if following else None
                return token_out, items

        return ItemPaged(page, same_page)

    def submit_transaction(self, operations: Iterable[Any], **kwargs: Any) -> list[Mapping[str, Any]]:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "submit_transaction")
        steps: list[tuple[str, Mapping[str, Any], Mapping[str, Any]]] = []
        for op in operations:
            if not isinstance(op, tuple) or len(op) not in (2, 3):
                raise TypeError(
                    "The value of 'operations' must be an iterator of Tuples. Please check documentation for correct Tuple format."
                )
            steps.append((str(getattr(op[0], "value", op[0])).lower(), op[1], op[2] if len(op) == 3 else {}))
        with self.account.lock:
            self.account.log("POST", "$batch")
            try:
                table = self._table()
            except _Refused as refused:
                raise self._transaction_error(0, refused) from None
            keys = [(str(e.get("PartitionKey")), str(e.get("RowKey"))) for _, e, _ in steps]
            if len({pk for pk, _ in keys}) > 1:
                raise self._transaction_error(
                    0,
                    _Refused(
                        400,
                        "CommandsInBatchActOnDifferentPartitions",
                        "All commands in a batch must operate on same entity group.",
                    ),
                )
            if len(steps) > TRANSACTION_LIMIT:
                raise self._transaction_error(
                    0,
                    _Refused(
                        400,
                        "InvalidInput",
                        "The batch request operation exceeds the maximum 100 changes per change set.",
                    ),
                )
            if len(set(keys)) < len(keys):
                raise self._transaction_error(
                    0,
                    _Refused(
                        400,
                        "InvalidDuplicateRow",
                        "The batch request contains multiple changes with same row key.",
                    ),
                )
            work = dict(table.entities)
            answers: list[Mapping[str, Any]] = []
            for index, (operation, entity, options) in enumerate(steps):
                try:
                    answers.append(self._apply(work, operation, entity, options))
                except _Refused as refused:
                    raise self._transaction_error(index, refused) from None
            table.entities = work
            return answers

    @staticmethod
    def _transaction_error(index: int, refused: _Refused) -> TableTransactionError:
        error = TableTransactionError(
            message=f"{index}:{refused.message}",
            response=cast(Any, ErrorResponse(refused.status, refused.code)),
        )
        error.error_code = refused.code  # type: ignore[attr-defined]
        return error


class MemoryTableService:
    """The Table service of a `MemoryStorage` (azure-data-tables' `TableServiceClient`, as used)."""

    def __init__(self, account: MemoryStorage) -> None:
        self.account = account
        self.url = account.url()

    def get_table_client(self, table_name: str) -> MemoryTableClient:
        return MemoryTableClient(self.account, table_name)

    def create_table(self, table_name: str, **kwargs: Any) -> MemoryTableClient:
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "create_table")
        _validate_storage_tablename(table_name)  # type: ignore[no-untyped-call]
        with self.account.lock:
            self.account.log("POST", "Tables")
            if table_name.lower() in self.account.tables:
                raise table_error(409, "TableAlreadyExists", "The table specified already exists.")
            self.account.tables[table_name.lower()] = TableRecord(table_name)
        return self.get_table_client(table_name)

    def delete_table(self, table_name: str, **kwargs: Any) -> None:
        """Delete a table and its entities; a missing table is no error (as the SDK answers a 404)."""
        kwargs.pop("timeout", None)
        refuse_unknown(kwargs, "delete_table")
        with self.account.lock:
            self.account.log("DELETE", f"Tables('{table_name}')")
            self.account.tables.pop(table_name.lower(), None)

    def query_tables(self, query_filter: str, **kwargs: Any) -> ItemPaged[TableItem]:
        size = min(int(kwargs.pop("results_per_page", None) or TABLE_PAGE), TABLE_PAGE)
        kwargs.pop("timeout", None)
        if kwargs.pop("parameters", None):
            raise NotImplementedError("query_tables(parameters=...)")
        refuse_unknown(kwargs, "query_tables")
        where = _Filter(query_filter)

        def page(marker: str | None) -> tuple[str | None, list[TableItem]]:
            with self.account.lock:
                self.account.log("GET", "Tables")
                names = sorted(
                    t.name
                    for t in self.account.tables.values()
                    if where.holds({"TableName": t.name}) and (marker is None or t.name >= marker)
                )
                return (names[size] if len(names) > size else None), [TableItem(n) for n in names[:size]]

        return ItemPaged(page, same_page)
