"""Shared fixtures: a real Azurite process on free ports for integration tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from devstack.azurite import Azurite, start_azurite  # noqa: E402


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """One Azurite for the whole test session (tests use unique queue/container names)."""
    log = tmp_path_factory.mktemp("azurite-log") / "azurite.log"
    az = start_azurite(log_path=log)
    try:
        yield az
    finally:
        az.cleanup()


@pytest.fixture
def storage_env(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment pointing the app's settings at the test Azurite."""
    env = {"AzureWebJobsStorage": azurite.connection_string}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return dict(os.environ)
