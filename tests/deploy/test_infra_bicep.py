"""infra/main.bicep mirrors infra/main.json: the same parameters, resources and app settings,
only declared symbols, no keys (parsed with pycep)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pycep
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from armeval import (
    is_expression,
)

from tests.deploy.infra_support import (
    BICEP_PATH,
    app_settings,
    deployment,
)

# ------------------------------------------------------------------ Bicep mirrors the JSON


@pytest.fixture(scope="module")
def bicep() -> dict[str, Any]:
    # pycep's TypedDict, walked here as plain JSON
    parsed = cast(dict[str, Any], pycep.BicepParser().parse(file_path=BICEP_PATH))
    return parsed


def _decorator(spec: dict[str, Any], kind: str) -> Any:
    for d in spec.get("decorators", []):
        if d["type"] == kind:
            return d["argument"]
    return None


def test_bicep_declares_the_same_parameters(bicep: dict[str, Any], template: dict[str, Any]) -> None:
    assert list(bicep["parameters"]) == list(template["parameters"])
    for name, spec in bicep["parameters"].items():
        arm = template["parameters"][name]
        secure = any(d["type"] == "secure" for d in spec.get("decorators", []))
        assert ("secure" + spec["type"] if secure else spec["type"]) == arm["type"], name
        assert _decorator(spec, "description") == arm["metadata"]["description"], name
        assert _decorator(spec, "allowed") == arm.get("allowedValues"), name
        for bicep_kind, arm_kind in (
            ("min_length", "minLength"),
            ("max_length", "maxLength"),
            ("min_value", "minValue"),
            ("max_value", "maxValue"),
        ):
            assert _decorator(spec, bicep_kind) == arm.get(arm_kind), (name, arm_kind)
        if not is_expression(arm.get("defaultValue")):
            assert spec["default"] == arm.get("defaultValue"), name


def test_bicep_declares_the_same_resources(bicep: dict[str, Any], template: dict[str, Any]) -> None:
    bicep_types = sorted((r["type"], r["api_version"]) for r in bicep["resources"].values())
    arm_types = sorted((r["type"], r["apiVersion"]) for r in template["resources"])
    assert bicep_types == arm_types
    assert list(bicep["outputs"]) == list(template["outputs"])
    assert bicep["variables"]["roles"]["value"] == template["variables"]["roles"]
    assert bicep["globals"]["scope"]["value"] == "resourceGroup"


def test_bicep_app_settings_match(bicep: dict[str, Any], template: dict[str, Any]) -> None:
    union = bicep["resources"]["appSettings"]["config"]["properties"]["function"]
    assert union["type"] == "union"
    assert union["parameters"]["arg_1"] == "extraAppSettings"
    assert union["parameters"]["arg_3"] == "consoleSettings"
    bicep_settings = {**union["parameters"]["arg_2"], **bicep["variables"]["consoleSettings"]["value"]}
    resources, _ = deployment(template, "defaults")
    assert list(bicep_settings) == list(app_settings(resources))
    assert bicep_settings["AzureWebJobsStorage__credential"] == "managedidentity"
    assert bicep_settings["LEDGER_CONTAINER"] == "ledger"
    site = bicep["resources"]["functionApp"]["config"]["properties"]
    assert "appSettings" not in site["siteConfig"], "app settings live in the sites/config resource only"
    assert site["functionAppConfig"]["runtime"] == {"name": "python", "version": "3.11"}
    storage = bicep["resources"]["storage"]["config"]["properties"]
    assert storage["allowSharedKeyAccess"] is False


def _bicep_symbols(text: str) -> set[str]:
    return set(re.findall(r"^(?:param|var|resource|output)\s+([A-Za-z_]\w*)", text, flags=re.M))


def test_bicep_references_only_declared_symbols() -> None:
    text = BICEP_PATH.read_text(encoding="utf-8")
    code = re.sub(r"(?<!:)//.*", "", text)  # comments, not the // of a URL
    declared = _bicep_symbols(code)
    builtins = {"resourceGroup", "environment", "subscription", "tenant", "deployment"}
    interpolated = set(re.findall(r"\$\{\s*([A-Za-z_]\w*)", code))
    accessed = set(re.findall(r"\b([A-Za-z_]\w*)\.(?:id|name|properties)\b", code))
    assert interpolated | accessed <= declared | builtins, (interpolated | accessed) - declared - builtins
    # every param and var is used somewhere besides its declaration
    for symbol in re.findall(r"^(?:param|var)\s+([A-Za-z_]\w*)", code, flags=re.M):
        uses = re.findall(rf"(?<![\w.']){symbol}\b", code)
        assert len(uses) >= 2, f"{symbol} is declared but never used"


def _iter_bicep_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _iter_bicep_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _iter_bicep_strings(v)


def test_bicep_reads_no_keys(bicep: dict[str, Any]) -> None:
    text = BICEP_PATH.read_text(encoding="utf-8")
    assert "listKeys" not in text
    assert "AccountKey" not in text
    assert not any("list_keys" in s for s in _iter_bicep_strings(bicep["resources"]))
