"""Import DIR/function_app.py, find its single FunctionApp and index its functions (once)."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azure.functions.decorators.function_app import FunctionRegister

from devhost.config import ConfigError

TRIGGER_TYPES = ("queueTrigger", "httpTrigger", "timerTrigger")
OUTPUT_TYPES = ("queue", "http")


@dataclass(frozen=True)
class Binding:
    type: str
    direction: str
    name: str
    raw: dict[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)


@dataclass
class FunctionSpec:
    """One indexed function: its trigger, its output bindings and (in the worker) the user callable."""

    name: str
    func: Callable[..., Any] | None
    trigger: Binding
    outputs: list[Binding] = field(default_factory=list)
    wants_context: bool = False
    is_async: bool = False

    @property
    def kind(self) -> str:
        return {"queueTrigger": "queue", "httpTrigger": "http", "timerTrigger": "timer"}[self.trigger.type]

    def describe(self) -> tuple[str, list[dict[str, Any]], bool, bool]:
        """What the worker sends the host after indexing: no callable, only plain data."""
        raws = [self.trigger.raw, *(b.raw for b in self.outputs)]
        return self.name, raws, self.wants_context, self.is_async


def spec_from_description(described: tuple[str, list[dict[str, Any]], bool, bool]) -> FunctionSpec:
    """The host's copy of a function the worker indexed (`func` is None: calls go to the worker)."""
    name, raws, wants_context, is_async = described
    trigger, *outputs = [_binding(raw) for raw in raws]
    return FunctionSpec(name, None, trigger, outputs, wants_context, is_async)


def _binding(raw_json: str | dict[str, Any]) -> Binding:
    raw = json.loads(raw_json) if isinstance(raw_json, str) else dict(raw_json)
    return Binding(
        type=str(raw.get("type", "")),
        direction=str(raw.get("direction", "IN")).upper(),
        name=str(raw.get("name", "")),
        raw=raw,
    )


def find_app(module: Any) -> FunctionRegister:
    """The single FunctionApp in a module; zero or several is an error (as in the worker)."""
    apps: list[FunctionRegister] = []
    for value in vars(module).values():
        if isinstance(value, FunctionRegister) and all(value is not a for a in apps):
            apps.append(value)
    where = getattr(module, "__file__", module)
    if not apps:
        raise ConfigError(f"{where}: no azure.functions.FunctionApp instance found")
    if len(apps) > 1:
        raise ConfigError(f"{where}: {len(apps)} FunctionApp instances found; exactly one is allowed")
    return apps[0]


def import_function_app(app_dir: Path) -> Any:
    """Put DIR first on sys.path and import its `function_app` module."""
    path = app_dir.resolve()
    if not (path / "function_app.py").is_file():
        raise ConfigError(f"{path}: no function_app.py")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    sys.modules.pop("function_app", None)
    return importlib.import_module("function_app")


def index_functions(app: FunctionRegister) -> list[FunctionSpec]:
    """Call app.get_functions() once and turn each function into a FunctionSpec."""
    specs: list[FunctionSpec] = []
    for fn in app.get_functions():
        name = str(fn.get_function_name())
        bindings = [_binding(raw) for raw in fn.get_raw_bindings()]
        triggers = [b for b in bindings if b.type.endswith("Trigger")]
        if len(triggers) != 1:
            raise ConfigError(f"function {name}: expected exactly one trigger, found {len(triggers)}")
        trigger = triggers[0]
        if trigger.type not in TRIGGER_TYPES:
            raise ConfigError(f"function {name}: devhost does not support trigger type {trigger.type!r}")
        outputs = []
        for b in bindings:
            if b is trigger:
                continue
            if b.direction != "OUT" or b.type not in OUTPUT_TYPES:
                raise ConfigError(
                    f"function {name}: devhost does not support {b.direction} binding "
                    f"{b.name!r} of type {b.type!r} (supported outputs: {', '.join(OUTPUT_TYPES)})"
                )
            if b.type == "http" and trigger.type != "httpTrigger":
                raise ConfigError(f"function {name}: http output without an http trigger")
            outputs.append(b)
        user_fn = fn.get_user_function()
        params = inspect.signature(user_fn).parameters
        for b in [trigger, *outputs]:
            if b.name != "$return" and b.name not in params:
                raise ConfigError(f"function {name}: binding {b.name!r} is not a parameter of the function")
        specs.append(
            FunctionSpec(
                name,
                user_fn,
                trigger,
                outputs,
                wants_context="context" in params,
                is_async=inspect.iscoroutinefunction(user_fn),
            )
        )
    return specs


def load_functions(app_dir: Path) -> list[FunctionSpec]:
    module = import_function_app(app_dir)
    return index_functions(find_app(module))
