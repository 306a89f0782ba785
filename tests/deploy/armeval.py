"""A small evaluator of ARM template expressions, enough to expand infra/main.json offline.

It parses every "[...]" expression (so a typo in a function name or a dangling parenthesis fails),
resolves parameters()/variables(), expands copy loops and conditions, and computes resource ids, so
tests can assert on the deployment the template would produce. reference() returns stand-in runtime
properties for the resource types this template uses (and fails for any other), and records which
resources each resource reads, so missing dependsOn entries can be detected.

Only ARM functions are implemented; an unknown function is an error, as it would be in Azure.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

SUBSCRIPTION_ID = "00000000-0000-0000-0000-00000000aaaa"
RESOURCE_GROUP = "rg-jobs"
RG_ID = f"/subscriptions/{SUBSCRIPTION_ID}/resourceGroups/{RESOURCE_GROUP}"
LOCATION = "swedencentral"


class ArmError(Exception):
    pass


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class Lit:
    value: Any


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Prop:
    target: Any
    name: str


@dataclass(frozen=True)
class Index:
    target: Any
    index: Any


_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+)|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>[(),.\[\]]))"
)


def _tokenize(text: str) -> list[tuple[str, str]]:
    pos, out = 0, []
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ArmError(f"cannot tokenize at {pos}: {text[pos : pos + 20]!r} in {text!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise ArmError(f"expected {value!r} at token {self.i} in {self.text!r}, got {tok!r}")
        self.i += 1
        return tok

    def parse(self) -> Any:
        node = self.expr()
        if self.peek() is not None:
            raise ArmError(f"trailing tokens in {self.text!r}: {self.tokens[self.i :]}")
        return node

    def expr(self) -> Any:
        kind, value = self.take()
        node: Any
        if kind == "str":
            node = Lit(value[1:-1].replace("''", "'"))
        elif kind == "num":
            node = Lit(int(value))
        elif kind == "ident":
            self.take("(")
            args: list[Any] = []
            if self.peek() != ("punct", ")"):
                args.append(self.expr())
                while self.peek() == ("punct", ","):
                    self.take(",")
                    args.append(self.expr())
            self.take(")")
            node = Call(value, tuple(args))
        else:
            raise ArmError(f"unexpected {value!r} in {self.text!r}")
        while self.peek() in (("punct", "."), ("punct", "[")):
            if self.take()[1] == ".":
                kind, name = self.take()
                if kind != "ident":
                    raise ArmError(f"property name expected in {self.text!r}")
                node = Prop(node, name)
            else:
                node = Index(node, self.expr())
                self.take("]")
        return node


def is_expression(value: Any) -> bool:
    return (
        isinstance(value, str)
        and value.startswith("[")
        and value.endswith("]")
        and not value.startswith("[[")
    )


def parse(text: str) -> Any:
    """Parse an expression string including its brackets: "[concat('a', 'b')]"."""
    if not is_expression(text):
        raise ArmError(f"not an expression: {text!r}")
    return _Parser(text[1:-1]).parse()


def walk_strings(value: Any) -> list[str]:
    """Every string (keys included) in a JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in walk_strings(item)]
    if isinstance(value, dict):
        return [s for k, item in value.items() for s in [k, *walk_strings(item)]]
    return []


def calls_in(node: Any) -> list[Call]:
    """All calls in a parsed expression."""
    if isinstance(node, Call):
        return [node, *(c for a in node.args for c in calls_in(a))]
    if isinstance(node, Prop):
        return calls_in(node.target)
    if isinstance(node, Index):
        return calls_in(node.target) + calls_in(node.index)
    return []


# --------------------------------------------------------------------------- evaluation


def resource_id(type_: str, *names: str, scope: str = RG_ID) -> str:
    segments = type_.split("/")
    namespace, types = segments[0], segments[1:]
    if len(types) != len(names):
        raise ArmError(f"resourceId({type_!r}) needs {len(types)} name segments, got {names}")
    path = "/".join(f"{t}/{n}" for t, n in zip(types, names, strict=True))
    return f"{scope}/providers/{namespace}/{path}"


def unique_string(*parts: str) -> str:
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    return "".join(alphabet[int(digest[i : i + 2], 16) % 32] for i in range(0, 26, 2))


def fake_guid(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "|".join(parts)))


def _type_of(rid: str) -> tuple[str, list[str]]:
    """('Microsoft.Storage/storageAccounts', [name]) from a resource id."""
    tail = rid.split("/providers/")[-1].split("/")
    namespace, rest = tail[0], tail[1:]
    return "/".join([namespace, *rest[0::2]]), rest[1::2]


def runtime_properties(rid: str) -> dict[str, Any]:
    """Stand-in for what reference() returns after deployment, per resource type."""
    type_, names = _type_of(rid)
    name = names[-1]
    if type_ == "Microsoft.ManagedIdentity/userAssignedIdentities":
        return {
            "clientId": fake_guid("client", rid),
            "principalId": fake_guid("principal", rid),
            "tenantId": fake_guid("tenant"),
        }
    if type_ == "Microsoft.Storage/storageAccounts":
        return {
            "primaryEndpoints": {
                svc: f"https://{name}.{svc}.core.windows.net/" for svc in ("blob", "queue", "table", "file")
            }
            | {"dfs": f"https://{name}.dfs.core.windows.net/"}
        }
    if type_ == "Microsoft.Insights/components":
        ikey = fake_guid("ikey", rid)
        return {
            "ConnectionString": f"InstrumentationKey={ikey};IngestionEndpoint=https://{LOCATION}-0.in.applicationinsights.azure.com/",
            "InstrumentationKey": ikey,
        }
    if type_ == "Microsoft.Web/sites":
        return {"defaultHostName": f"{name}.azurewebsites.net"}
    raise ArmError(f"reference() to a type the stand-ins do not know: {type_}")


@dataclass
class Evaluator:
    template: Mapping[str, Any]
    parameters: Mapping[str, Any]
    copy_index: int | None = None
    references: set[str] = field(default_factory=set)
    _var_cache: dict[str, Any] = field(default_factory=dict)
    _var_stack: list[str] = field(default_factory=list)

    def value(self, raw: Any) -> Any:
        """Evaluate a JSON value: expressions in strings (also in keys), recursively."""
        if isinstance(raw, str):
            if raw.startswith("[["):
                return raw[1:]
            return self.node(parse(raw)) if is_expression(raw) else raw
        if isinstance(raw, list):
            return [self.value(item) for item in raw]
        if isinstance(raw, dict):
            return {str(self.value(k)): self.value(item) for k, item in raw.items()}
        return raw

    def variable(self, name: str) -> Any:
        variables = self.template.get("variables", {})
        if name not in variables:
            raise ArmError(f"variables({name!r}) is not declared")
        if name in self._var_stack:
            raise ArmError(f"variable cycle: {' -> '.join([*self._var_stack, name])}")
        if name not in self._var_cache:
            self._var_stack.append(name)
            try:
                saved, self.copy_index = self.copy_index, None
                self._var_cache[name] = self.value(variables[name])
                self.copy_index = saved
            finally:
                self._var_stack.pop()
        return self._var_cache[name]

    def parameter(self, name: str) -> Any:
        declared = self.template.get("parameters", {})
        if name not in declared:
            raise ArmError(f"parameters({name!r}) is not declared")
        if name in self.parameters:
            return self.parameters[name]
        if "defaultValue" not in declared[name]:
            raise ArmError(f"parameter {name!r} has no value and no default")
        return self.value(declared[name]["defaultValue"])

    def node(self, node: Any) -> Any:
        if isinstance(node, Lit):
            return node.value
        if isinstance(node, Prop):
            target = self.node(node.target)
            if not isinstance(target, Mapping) or node.name not in target:
                raise ArmError(f"no property {node.name!r} on {target!r}")
            return target[node.name]
        if isinstance(node, Index):
            target, index = self.node(node.target), self.node(node.index)
            try:
                return target[index]
            except (KeyError, IndexError, TypeError) as exc:
                raise ArmError(f"cannot index {target!r} with {index!r}") from exc
        assert isinstance(node, Call)
        if node.name == "if":  # lazy: only the taken branch is evaluated, as in ARM
            if len(node.args) != 3:
                raise ArmError("if() takes 3 arguments")
            return self.node(node.args[1] if self._bool(self.node(node.args[0])) else node.args[2])
        fn = self.FUNCTIONS.get(node.name.lower())
        if fn is None:
            raise ArmError(f"unknown template function {node.name!r}")
        return fn(self, *[self.node(a) for a in node.args])

    @staticmethod
    def _bool(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ArmError(f"expected a bool, got {value!r}")
        return value

    # -- functions (names as in the ARM template function reference)
    def _parameters(self, name: str) -> Any:
        return self.parameter(name)

    def _variables(self, name: str) -> Any:
        return self.variable(name)

    def _concat(self, *items: Any) -> Any:
        if items and all(isinstance(i, list) for i in items):
            return [x for i in items for x in i]
        if all(isinstance(i, str | int) for i in items):
            return "".join(str(i) for i in items)
        raise ArmError(f"concat() of mixed arguments: {items!r}")

    def _format(self, fmt: str, *args: Any) -> str:
        def sub(m: re.Match[str]) -> str:
            i = int(m.group(1))
            if i >= len(args):
                raise ArmError(f"format() placeholder {{{i}}} has no argument in {fmt!r}")
            arg = args[i]
            return str(arg).lower() if isinstance(arg, bool) else str(arg)

        return re.sub(r"\{(\d+)\}", sub, fmt)

    def _reference(self, rid: str, api_version: str | None = None, *rest: Any) -> Any:
        if not isinstance(rid, str) or not rid.startswith("/subscriptions/"):
            raise ArmError(f"reference() needs a resource id, got {rid!r}")
        if api_version is None:
            raise ArmError("reference() without apiVersion to a resource of this template")
        self.references.add(rid)
        return runtime_properties(rid)

    def _copy_index(self, offset: int = 0) -> int:
        if self.copy_index is None:
            raise ArmError("copyIndex() outside a copy loop")
        return self.copy_index + offset

    def _type_name(self, type_: str, *names: str) -> str:
        return resource_id(type_, *names)

    FUNCTIONS: ClassVar[dict[str, Callable[..., Any]]] = {}


def _equals(_: Evaluator, a: Any, b: Any) -> bool:
    return bool(a == b)


def _empty(_: Evaluator, v: Any) -> bool:
    return v is None or len(v) == 0


def _string(_: Evaluator, v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, str | int):
        return str(v)
    raise ArmError(f"string() of {v!r} not supported here")


def _union(_: Evaluator, *items: Any) -> Any:
    if all(isinstance(i, dict) for i in items):
        merged: dict[str, Any] = {}
        for item in items:  # shallow, later arguments win (as in ARM for top-level keys)
            merged.update(item)
        return merged
    if all(isinstance(i, list) for i in items):
        out: list[Any] = []
        for item in items:
            out.extend(x for x in item if x not in out)
        return out
    raise ArmError(f"union() of mixed arguments: {items!r}")


def _take(_: Evaluator, v: Any, n: int) -> Any:
    return v[:n]


def _subscription_resource_id(_: Evaluator, type_: str, *names: str) -> str:
    return resource_id(type_, *names, scope=f"/subscriptions/{SUBSCRIPTION_ID}")


def _extension_resource_id(_: Evaluator, scope: str, type_: str, *names: str) -> str:
    return resource_id(type_, *names, scope=scope)


def _create_object(_: Evaluator, *kv: Any) -> dict[str, Any]:
    if len(kv) % 2:
        raise ArmError("createObject() needs key/value pairs")
    return {kv[i]: kv[i + 1] for i in range(0, len(kv), 2)}


Evaluator.FUNCTIONS = {
    "parameters": Evaluator._parameters,
    "variables": Evaluator._variables,
    "concat": Evaluator._concat,
    "format": Evaluator._format,
    "reference": Evaluator._reference,
    "copyindex": Evaluator._copy_index,
    "resourceid": Evaluator._type_name,
    "subscriptionresourceid": _subscription_resource_id,
    "extensionresourceid": _extension_resource_id,
    "equals": _equals,
    "empty": _empty,
    "not": lambda _, v: not Evaluator._bool(v),
    "and": lambda _, *v: all(Evaluator._bool(x) for x in v),
    "or": lambda _, *v: any(Evaluator._bool(x) for x in v),
    "string": _string,
    "int": lambda _, v: int(v),
    "add": lambda _, a, b: int(a) + int(b),
    "bool": lambda _, v: bool(v),
    "tolower": lambda _, v: v.lower(),
    "toupper": lambda _, v: v.upper(),
    "take": _take,
    "union": _union,
    "length": lambda _, v: len(v),
    "createarray": lambda _, *v: list(v),
    "join": lambda _, v, sep: sep.join(str(x) for x in v),
    "createobject": _create_object,
    "uniquestring": lambda _, *parts: unique_string(*parts),
    "guid": lambda _, *parts: fake_guid(*parts),
    "newguid": lambda _: fake_guid("new"),
    "resourcegroup": lambda _: {"id": RG_ID, "name": RESOURCE_GROUP, "location": LOCATION},
    "subscription": lambda _: {"id": f"/subscriptions/{SUBSCRIPTION_ID}", "subscriptionId": SUBSCRIPTION_ID},
    "environment": lambda _: {
        "name": "AzureCloud",
        "suffixes": {"storage": "core.windows.net"},
        "authentication": {"loginEndpoint": "https://login.microsoftonline.com/"},
    },
    "tenant": lambda _: {"tenantId": fake_guid("tenant")},
    "true": lambda _: True,
    "false": lambda _: False,
}


# --------------------------------------------------------------------------- expansion


@dataclass
class Deployed:
    """One resource (one copy of a loop) as the deployment would create it."""

    type: str
    name: str
    id: str
    body: dict[str, Any]
    copy_name: str | None
    depends_on: list[str]
    references: set[str]


def _resource_scope(scope: str | None) -> str:
    if not scope:
        return RG_ID
    if scope.startswith("/subscriptions/"):
        return scope
    # Bicep style relative scope: 'Microsoft.Storage/storageAccounts/name'
    segments = scope.split("/")
    type_ = "/".join([segments[0], *segments[1::2]])
    return resource_id(type_, *segments[2::2])


def expand(
    template: Mapping[str, Any], parameters: Mapping[str, Any]
) -> tuple[list[Deployed], dict[str, Any]]:
    """The resources (conditions applied, copies expanded, all expressions evaluated) and outputs."""
    check_parameters(template, parameters)
    root = Evaluator(template, parameters)
    deployed: list[Deployed] = []
    for raw in template["resources"]:
        copy = raw.get("copy")
        count = root.value(copy["count"]) if copy else 1
        for i in range(count):
            ev = Evaluator(template, parameters, copy_index=i if copy else None)
            ev._var_cache = root._var_cache  # variables do not depend on copyIndex()
            if "condition" in raw and not Evaluator._bool(ev.value(raw["condition"])):
                continue
            body = {k: ev.value(v) for k, v in raw.items() if k not in ("copy", "dependsOn", "condition")}
            name = body["name"]
            scope = _resource_scope(body.get("scope"))
            rid = resource_id(raw["type"], *name.split("/"), scope=scope)
            deployed.append(
                Deployed(
                    type=raw["type"],
                    name=name,
                    id=rid,
                    body=body,
                    copy_name=copy["name"] if copy else None,
                    depends_on=[d if not is_expression(d) else ev.value(d) for d in raw.get("dependsOn", [])],
                    references=set(ev.references),
                )
            )
    outputs = {}
    for name, spec in template.get("outputs", {}).items():
        ev = Evaluator(template, parameters)
        ev._var_cache = root._var_cache
        outputs[name] = ev.value(spec["value"])
    return deployed, outputs


def _length(value: Any) -> int:
    return len(value) if isinstance(value, str | list) else 0


_TYPES = {"string": str, "securestring": str, "int": int, "bool": bool, "object": dict, "array": list}


def check_parameters(template: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    declared = template.get("parameters", {})
    for name in values:
        if name not in declared:
            raise ArmError(f"parameter {name!r} is not declared by the template")
    ev = Evaluator(template, values)
    for name, spec in declared.items():
        if name not in values and "defaultValue" not in spec:
            raise ArmError(f"required parameter {name!r} has no value")
        value: Any = ev.parameter(name)
        expected = _TYPES[spec["type"].lower()]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ArmError(f"parameter {name!r}={value!r} is not of type {spec['type']}")
        if "allowedValues" in spec and value not in spec["allowedValues"]:
            raise ArmError(f"parameter {name!r}={value!r} is not one of {spec['allowedValues']}")
        if "minValue" in spec and value < spec["minValue"]:
            raise ArmError(f"parameter {name!r}={value!r} < minValue {spec['minValue']}")
        if "maxValue" in spec and value > spec["maxValue"]:
            raise ArmError(f"parameter {name!r}={value!r} > maxValue {spec['maxValue']}")
        if "minLength" in spec and _length(value) < spec["minLength"]:
            raise ArmError(f"parameter {name!r} shorter than minLength {spec['minLength']}")
        if "maxLength" in spec and _length(value) > spec["maxLength"]:
            raise ArmError(f"parameter {name!r} longer than maxLength {spec['maxLength']}")
