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


def test_a_call_budget_cuts_retries_and_sets_timeouts_only_inside_its_context() -> None:
    settings = {"total": 3, "connect": 3, "read": 3, "status": 3}
    options: dict[str, Any] = {"read_timeout": 1.5}
    assert storage.within_budget(dict(settings), options) == settings and options == {"read_timeout": 1.5}
    budget = storage.CallBudget(retries=1, backoff_s=0.5, connect_s=2.0, read_s=3.0)
    assert budget.worst_s == 2 * (2.0 + 3.0) + 0.5
    with storage.bounded_calls(budget):
        cut = storage.within_budget(dict(settings), options)
        assert {k: cut[k] for k in settings} == dict.fromkeys(settings, 1) and cut["budget"] is budget
        assert options == {"read_timeout": 1.5, "connection_timeout": 2.0}  # a per-call value wins
        with storage.bounded_calls(storage.CallBudget(0, 0.0, 1.0, 1.0)):
            assert storage.within_budget(dict(settings), {})["total"] == 0  # the inner one
        assert storage.within_budget(dict(settings), {})["total"] == 1
    assert storage.within_budget(dict(settings), {}) == settings


def test_the_clients_retry_policies_read_the_budget() -> None:
    clients = storage.clients_for(_dev_connection())
    for client in (clients.blob, clients.queue_service):
        policy: Any = client._config.retry_policy  # the SDK's configuration object
        assert policy.total_retries == 3 and policy.initial_backoff == 1
        budget = storage.CallBudget(0, 0.25, 1.0, 1.0)
        assert policy.get_backoff_time({"count": 1, "budget": budget}) == 0.25
        assert 1.5 <= policy.get_backoff_time({"count": 1}) <= 3.5  # 1 + 1.5 ** 1, jitter 1
