"""`MemoryTables`: the `Tables` port in memory (tests and the deterministic simulation).

Faithful where the app's guarantees depend on it, as Table storage answers: ETags and If-Match,
OData filters of comparisons joined by `and` (what the app sends; another filter raises
NotImplementedError rather than pass unchecked), pages of at most 1,000 rows with continuation
tokens, entity group transactions (one partition, at most 100 operations, all or nothing), the
value rules (ints are Int32, None left out) and the key rules. Every call is one request, logged
in `requests` as the REST request it stands for (`GET /devstoreaccount1/jobs20260101()`), so
request counts can be asserted as they are over HTTP.
"""

from __future__ import annotations

import contextlib
import copy
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from shared.storage.failures import AlreadyExists, ConditionFailed, NotFound, StorageError
from shared.storage.ports import TRANSACTION_SIZE, Row, TableOp, TablePage

PAGE_ROWS = 1000
"""Rows one query answers at most (the service's page)."""
MAX_KEY_CHARS = 1024
MAX_STRING_CHARS = 32 * 1024
MAX_PROPERTIES = 255
FORBIDDEN_KEY = re.compile(r"[/\\#?\x00-\x1f\x7f-\x9f]")
TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]{2,62}")


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class _Entity:
    props: dict[str, Any]
    etag: str
    timestamp: datetime


def _refused(status: int, code: str, what: str) -> StorageError:
    kind = {404: NotFound, 409: AlreadyExists, 412: ConditionFailed}.get(status, StorageError)
    return kind(f"{what}: {code}", status, code)


def _stored(entity: Mapping[str, Any], what: str) -> dict[str, Any]:
    """An entity's properties as the SDK sends them (None left out) and the service keeps them."""
    pk, rk = entity.get("PartitionKey"), entity.get("RowKey")
    if pk is None or rk is None:
        raise ValueError("PartitionKey and RowKey must be present in an entity")
    out: dict[str, Any] = {}
    for name, value in entity.items():
        if value is None:
            continue
        if type(value) is int and not -(2**31) <= value < 2**31:
            raise TypeError(f"{value} is too large to be cast to type Edm.Int32")
        if type(value) not in (int, str, bool, float, bytes, datetime):
            raise TypeError(f"Type not supported when sending data to the service: {type(value)}")
        out[name] = value
    for key in (pk, rk):
        if not isinstance(key, str) or len(key) > MAX_KEY_CHARS or FORBIDDEN_KEY.search(key):
            raise _refused(400, "OutOfRangeInput", what)
    if len(out) > MAX_PROPERTIES:
        raise _refused(400, "TooManyProperties", what)
    if any(isinstance(v, str) and len(v) > MAX_STRING_CHARS for v in out.values()):
        raise _refused(400, "PropertyValueTooLarge", what)
    return out


class Filter:
    """An OData filter of comparisons joined by `and` (what the app sends), evaluated on a row."""

    TOKEN = re.compile(
        r"\s*(?:datetime(?P<datetime>'[^']*')|(?P<string>'(?:[^']|'')*')|(?P<number>-?\d+)(?![\w.])"
        r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<other>\S))"
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
                tokens.append(("value", word == "true") if word in ("true", "false") else ("word", word))
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
            if [kind for kind, _ in group] != ["word", "word", "value"] or group[1][1] not in self.OPS:
                self._refuse()
            self.terms.append((group[0][1], group[1][1], group[2][1]))

    def _refuse(self) -> NoReturn:
        raise NotImplementedError(f"OData filter not understood in memory: {self.text!r}")

    def holds(self, row: Mapping[str, Any]) -> bool:
        for name, op, value in self.terms:
            have = row.get(name)
            comparable = have is not None and (
                type(have) is type(value) or (type(have) in (int, float) and type(value) in (int, float))
            )
            if not comparable or not self.OPS[op](have, value):
                return False
        return True


class MemoryTables:
    """Tables in memory behind one lock; `requests` logs every call."""

    def __init__(
        self,
        clock: Callable[[], datetime] = _utcnow,
        account: str = "devstoreaccount1",
        requests: list[str] | None = None,
        lock: threading.RLock | None = None,
    ) -> None:
        self.clock = clock
        self.account = account
        self.requests: list[str] = requests if requests is not None else []
        self.lock = lock or threading.RLock()
        self.data: dict[str, dict[tuple[str, str], _Entity]] = {}
        """Tables by lower-case name (names are case-insensitive), with their entities."""
        self.names_as_created: dict[str, str] = {}
        self._seq = 0

    def log(self, method: str, path: str) -> None:
        self.requests.append(f"{method} /{self.account}/{path}")

    def etag(self, now: datetime) -> str:
        self._seq += 1
        return f"W/\"datetime'{now.strftime('%Y-%m-%dT%H%%3A%M%%3A%S')}.{self._seq:07d}Z'\""

    def table(self, name: str) -> MemoryTable:
        return MemoryTable(self, name)

    def names(self, where: str) -> list[str]:
        test = Filter(where)
        with self.lock:
            self.log("GET", "Tables")
            return sorted(n for n in self.names_as_created.values() if test.holds({"TableName": n}))


class MemoryTable:
    """One table of `MemoryTables` (the `Table` port)."""

    def __init__(self, tables: MemoryTables, name: str) -> None:
        self.tables = tables
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def _entities(self, what: str) -> dict[tuple[str, str], _Entity]:
        found = self.tables.data.get(self._name.lower())
        if found is None:
            raise _refused(404, "TableNotFound", what)
        return found

    def _path(self, pk: str, rk: str) -> str:
        return f"{self._name}(PartitionKey='{pk}',RowKey='{rk}')"

    def create(self) -> None:
        if not TABLE_NAME.fullmatch(self._name):
            raise ValueError(
                f"table names are 3-63 letters and digits, starting with a letter: {self._name!r}"
            )
        with self.tables.lock:
            self.tables.log("POST", "Tables")
            if self._name.lower() not in self.tables.data:
                self.tables.data[self._name.lower()] = {}
                self.tables.names_as_created[self._name.lower()] = self._name

    def drop(self) -> None:
        with self.tables.lock:
            self.tables.log("DELETE", f"Tables('{self._name}')")
            self.tables.data.pop(self._name.lower(), None)
            self.tables.names_as_created.pop(self._name.lower(), None)

    def _apply(self, entities: dict[tuple[str, str], _Entity], op: TableOp, what: str) -> str | None:
        props = _stored(op.entity, what) if op.kind != "delete" else dict(op.entity)
        key = (str(props["PartitionKey"]), str(props["RowKey"]))
        current = entities.get(key)
        if op.kind == "create" and current is not None:
            raise _refused(409, "EntityAlreadyExists", what)
        if op.kind in ("update", "delete"):
            if current is None:
                raise _refused(404, "ResourceNotFound", what)
            if op.etag is not None and op.etag != current.etag:
                raise _refused(412, "UpdateConditionNotSatisfied", what)
            if op.kind == "delete":
                del entities[key]
                return None
        now = self.tables.clock()
        entities[key] = _Entity(props, self.tables.etag(now), now)
        return entities[key].etag

    def _one(self, method: str, op: TableOp) -> str | None:
        pk, rk = str(op.entity.get("PartitionKey")), str(op.entity.get("RowKey"))
        what = f"{op.kind} of {rk} in {self._name}"
        with self.tables.lock:
            self.tables.log(method, self._path(pk, rk) if method != "POST" else self._name)
            return self._apply(self._entities(what), op, what)

    def get(self, partition: str, row: str) -> Row | None:
        with self.tables.lock:
            self.tables.log("GET", self._path(partition, row))
            try:
                found = self._entities(f"reading {row} of {self._name}").get((partition, row))
            except NotFound:
                return None
            return None if found is None else Row(copy.deepcopy(found.props), found.etag)

    def insert(self, entity: Mapping[str, Any]) -> str:
        return str(self._one("POST", TableOp("create", entity)))

    def upsert(self, entity: Mapping[str, Any]) -> None:
        self._one("PUT", TableOp("upsert", entity))

    def update(self, entity: Mapping[str, Any], etag: str) -> str:
        return str(self._one("PUT", TableOp("update", entity, etag)))

    def delete(self, partition: str, row: str, etag: str | None = None) -> None:
        """As the SDK answers: a missing entity (or table) is no error."""
        with contextlib.suppress(NotFound):
            self._one("DELETE", TableOp("delete", {"PartitionKey": partition, "RowKey": row}, etag))

    def query(
        self,
        where: str,
        *,
        size: int | None = None,
        select: Sequence[str] | None = None,
        continuation: Any = None,
    ) -> TablePage:
        test = Filter(where)
        room = min(size or PAGE_ROWS, PAGE_ROWS)
        with self.tables.lock:
            self.tables.log("GET", f"{self._name}()")
            entities = self._entities(f"querying {self._name}")
            start = tuple(continuation) if continuation else None
            keys = sorted(
                k
                for k, e in entities.items()
                if (start is None or k >= start) and test.holds({**e.props, "Timestamp": e.timestamp})
            )
            rows = []
            for k in keys[:room]:
                props = entities[k].props
                shown = props if select is None else {f: props[f] for f in select if f in props}
                rows.append(Row(copy.deepcopy(shown), entities[k].etag))
            return TablePage(rows, keys[room] if len(keys) > room else None)

    def rows(
        self, where: str, *, size: int | None = None, select: Sequence[str] | None = None
    ) -> Iterator[Row]:
        cont: Any = None
        while True:
            page = self.query(where, size=size, select=select, continuation=cont)
            yield from page.rows
            cont = page.continuation
            if cont is None:
                return

    def transact(self, ops: Sequence[TableOp]) -> list[str | None]:
        what = f"a transaction of {len(ops)} on {self._name}"
        with self.tables.lock:
            self.tables.log("POST", "$batch")
            table = self._entities(what)
            keys = [(str(op.entity.get("PartitionKey")), str(op.entity.get("RowKey"))) for op in ops]
            if len({pk for pk, _ in keys}) > 1:
                raise _refused(400, "CommandsInBatchActOnDifferentPartitions", what)
            if len(ops) > TRANSACTION_SIZE:
                raise _refused(400, "InvalidInput", what)
            if len(set(keys)) < len(keys):
                raise _refused(400, "InvalidDuplicateRow", what)
            work = dict(table)
            answers = [self._apply(work, op, what) for op in ops]
            table.clear()
            table.update(work)
            return answers
