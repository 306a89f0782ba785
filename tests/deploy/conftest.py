"""Fixtures of the deployment tests."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.deploy.infra_support import TEMPLATE_PATH


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    """infra/main.json, parsed."""
    data: dict[str, Any] = json.loads(TEMPLATE_PATH.read_text(encoding="utf-8"))
    return data
