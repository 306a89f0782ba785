"""Imports run one way: the pure ledger stands on nothing heavy (the contracts: pyproject.toml)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO_ROOT

HEAVY = (
    "requests",
    "azure",
    "pyarrow",
    "shared.spark",
    "shared.storage.clients",
    "shared.config.settings",
    "shared.interfaces.console",
)


def loaded_after(statement: str) -> list[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    )
    return list(json.loads(out.stdout))


def test_the_ledger_loads_no_storage_sdk_http_client_or_spark() -> None:
    modules = loaded_after("import shared.ledger")
    heavy = [m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]
    assert heavy == []
    assert [m for m in modules if m.startswith("shared")] == [
        "shared",
        "shared.core",
        "shared.core.documents",
        "shared.core.envelope",
        "shared.core.errors",
        "shared.core.jsontext",
        "shared.core.tracecontext",
        "shared.ledger",
    ]


def test_processing_does_not_load_the_console() -> None:
    modules = loaded_after("import shared.pipeline.processing")
    assert "shared.pipeline.processing" in modules
    assert [m for m in modules if m.startswith(("shared.interfaces.console", "shared.interfaces.api"))] == []
