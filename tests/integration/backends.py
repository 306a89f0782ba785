"""Where a test's storage lives: an in-memory account (the fast tier) or the test module's Azurite.

A test that takes the `storage_backend` fixture (tests/conftest.py) runs twice: `[memory]` on
`shared.storage.memory_account.MemoryAccount`, unmarked, so `make test-fast` runs it; `[azurite]`
on the real Azurite through `AzureAccount`, marked `azurite` and `integration`, so `make test` runs
it too. The app is built the same way on both (`ensure_resources`, `Runtime.over`,
`ensure_console_resources`); only the account differs. Tests reach storage through the ports
(`backend.account`, `rt.account`), held alike on both by tests/integration/test_port_contract.py.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from devstack.azurite import Azurite
from shared.config.settings import Settings
from shared.jobs import registry
from shared.runtime.wiring import Runtime, build_runtime, ensure_console_resources
from shared.storage.accounts import account_for, ensure_resources
from shared.storage.memory_account import MemoryAccount, SkippingClock
from shared.storage.ports import Account
from tests.integration.helpers import settings_env
from tests.storage_params import AZURITE, MEMORY


def app_handlers() -> dict[str, Any]:
    """The app's registry, with the test kinds (fault injection)."""
    return dict(registry(enable_test_kinds=True))


@dataclass
class Backend:
    """A storage account for one test, and the app built on it."""

    name: str
    account: Account
    connection_string: str
    azurite: Azurite | None = None
    memory: MemoryAccount | None = None
    wait: Callable[[float], None] = field(default=time.sleep)
    """Let `seconds` of the account's time pass (a real sleep on Azurite)."""

    @classmethod
    def in_memory(cls) -> Backend:
        """An in-memory account whose time is the real time; `wait` skips ahead in it without
        sleeping (message visibility and expiry: the app's clock does not move)."""
        clock = SkippingClock()
        account = MemoryAccount(clock)
        return cls(
            MEMORY,
            account,
            "UseDevelopmentStorage=true",  # settings need one; nothing connects to it
            memory=account,
            wait=clock.advance,
        )

    @classmethod
    def on_azurite(cls, azurite: Azurite) -> Backend:
        settings = Settings.from_env({"AzureWebJobsStorage": azurite.connection_string})
        return cls(AZURITE, account_for(settings.storage), azurite.connection_string, azurite=azurite)

    def settings(self, **extra: str) -> Settings:
        """Settings with queue and container names of their own."""
        return Settings.from_env(settings_env(self.connection_string, **extra))

    def record_requests(self, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
        """From now on, the storage requests this process sends, as `METHOD /account/path`: over
        HTTP on Azurite, the in-memory account's own log otherwise."""
        if self.memory is not None:
            log, start = self.memory.requests, len(self.memory.requests)
            return lambda: log[start:]
        import requests

        seen: list[str] = []
        original = requests.Session.send

        def counting(session: requests.Session, request: requests.PreparedRequest, **kwargs: Any) -> Any:
            seen.append(f"{request.method} {(request.path_url or '').split('?')[0]}")
            return original(session, request, **kwargs)

        monkeypatch.setattr(requests.Session, "send", counting)
        return lambda: list(seen)

    def runtime(self, handlers: Mapping[str, Any] | None = None, **extra: str) -> Runtime:
        """The app's runtime on this account, built as `build_runtime` builds it."""
        settings = self.settings(**extra)
        handlers = handlers or app_handlers()
        if self.azurite is not None:
            return build_runtime(settings, handlers=handlers)
        ensure_resources(self.account, settings)
        rt = Runtime.over(settings, self.account, handlers, f"{socket.gethostname()}:{os.getpid()}")
        ensure_console_resources(rt)
        return rt
