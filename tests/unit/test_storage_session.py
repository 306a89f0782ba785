"""The storage clients' HTTP session: requests' per-request environment lookups only when needed."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from shared.config.settings import Settings, StorageConnection
from shared.storage import clients as storage


@pytest.fixture(autouse=True)
def _no_system_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(urllib.request, "getproxies", dict)


@pytest.mark.parametrize("name", ["HTTPS_PROXY", "http_proxy", "ALL_PROXY", "no_proxy", "NETRC"])
def test_proxy_or_netrc_settings_keep_the_lookup(name: str, tmp_path: Path) -> None:
    assert storage.needs_environment({name: "x"}, [str(tmp_path / "none")])


def test_a_netrc_file_keeps_the_lookup(tmp_path: Path) -> None:
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine example login a password b\n")
    assert storage.needs_environment({}, [str(netrc)])


def test_system_proxies_keep_the_lookup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(urllib.request, "getproxies", lambda: {"https": "http://proxy:3128"})
    assert storage.needs_environment({}, [str(tmp_path / "none")])


def test_nothing_to_find_skips_the_lookup(tmp_path: Path) -> None:
    environ = {"PATH": "/usr/bin", "REQUESTS_CA_BUNDLE": "/etc/ca.pem", "JOBS_QUEUE": "jobs"}
    assert not storage.needs_environment(environ, [str(tmp_path / "none")])


def test_ca_bundle_is_passed_to_the_clients_once(monkeypatch: pytest.MonkeyPatch) -> None:
    assert storage.ca_bundle({"REQUESTS_CA_BUNDLE": "/a.pem", "CURL_CA_BUNDLE": "/b.pem"}) == "/a.pem"
    assert storage.ca_bundle({"CURL_CA_BUNDLE": "/b.pem"}) == "/b.pem"
    assert storage.ca_bundle({"REQUESTS_CA_BUNDLE": ""}) is None
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/a.pem")
    clients = storage.clients_for(_dev_connection())
    transport: Any = clients.blob._pipeline._transport  # the SDK's private wrappers, walked down
    while hasattr(transport, "_transport"):
        transport = transport._transport
    assert transport.connection_config.verify == "/a.pem"
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    assert "connection_verify" not in storage.client_kwargs()


def test_session_trusts_the_environment_only_with_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "NETRC_FILES", ())
    for name in [n for n in os.environ if n.lower().endswith("_proxy") or n.lower() == "netrc"]:
        monkeypatch.delenv(name)
    assert storage.requests_session().trust_env is False
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert storage.requests_session().trust_env is True


def _dev_connection() -> StorageConnection:

    return Settings.from_env({"AzureWebJobsStorage": "UseDevelopmentStorage=true"}).storage
