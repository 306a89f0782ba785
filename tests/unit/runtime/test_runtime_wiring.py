"""The runtime's wiring: what it refuses at start (no I/O)."""

from __future__ import annotations

from typing import cast

import pytest

from shared.config.settings import Settings
from shared.core.errors import SettingsError
from shared.runtime.wiring import Runtime
from shared.storage.accounts import AzureAccount
from shared.storage.clients import StorageClients


def test_a_runtime_without_a_table_service_is_refused_naming_the_setting() -> None:
    """The indexes are not optional: a connection naming no Table service fails at start."""
    settings = Settings.from_env(
        {
            "AzureWebJobsStorage": "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=eA==;"
            "BlobEndpoint=http://127.0.0.1:1/a;QueueEndpoint=http://127.0.0.1:2/a;"
        }
    )
    with pytest.raises(SettingsError, match=r"AzureWebJobsStorage: .*no TableEndpoint"):
        Runtime.over(settings, AzureAccount(cast(StorageClients, None), settings.storage), {}, "test")
