"""The limits' settings: parsed, and a wrong one refuses to start naming it."""

from __future__ import annotations

import pytest

from shared.config.settings import Settings
from shared.core.errors import SettingsError
from shared.core.setting_reader import SettingReader
from shared.jobs.http import HttpHandler
from shared.jobs.kinds import configure_kinds
from shared.permits.limit import Limit
from shared.permits.limit_settings import read_host_limits, read_permit_settings


def host_limits(env: dict[str, str]) -> tuple[object, list[str]]:
    problems: list[str] = []
    return read_host_limits(SettingReader(env, problems)), problems


def test_defaults_and_overrides_by_host() -> None:
    limits, problems = host_limits(
        {
            "HTTP_MAX_CONCURRENT_PER_HOST": "4",
            "HTTP_LIMITS_PER_HOST": '{"API.Partner.example": {"per_second": 10}, "bulk.example": null,'
            ' "slow.example": {"max_concurrent": 1}}',
        }
    )
    assert problems == []
    assert limits.for_host("other.example") == Limit("http:other.example", 4)  # type: ignore[attr-defined]
    assert limits.for_host("api.partner.example") == Limit("http:api.partner.example", 4, 10)  # type: ignore[attr-defined]
    assert limits.for_host("bulk.example") is None  # type: ignore[attr-defined]
    assert limits.for_host("slow.example") == Limit("http:slow.example", 1)  # type: ignore[attr-defined]
    unlimited, _ = host_limits({})
    assert unlimited.for_host("x.example") is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"HTTP_MAX_CONCURRENT_PER_HOST": "0"}, "HTTP_MAX_CONCURRENT_PER_HOST"),
        ({"HTTP_MAX_CONCURRENT_PER_HOST": "four"}, "HTTP_MAX_CONCURRENT_PER_HOST"),
        ({"HTTP_MAX_PER_SECOND_PER_HOST": "-1"}, "HTTP_MAX_PER_SECOND_PER_HOST"),
        ({"HTTP_LIMITS_PER_HOST": "{not json"}, "HTTP_LIMITS_PER_HOST is not JSON"),
        ({"HTTP_LIMITS_PER_HOST": "[1]"}, "HTTP_LIMITS_PER_HOST must be a JSON object"),
        ({"HTTP_LIMITS_PER_HOST": '{"https://a.example/x": {"max_concurrent": 1}}'}, "not a host name"),
        ({"HTTP_LIMITS_PER_HOST": '{"a.example": {"max": 1}}'}, "HTTP_LIMITS_PER_HOST['a.example']"),
        ({"HTTP_LIMITS_PER_HOST": '{"a.example": {"max_concurrent": 0}}'}, "max_concurrent must be"),
    ],
)
def test_a_wrong_setting_refuses_to_start_naming_it(env: dict[str, str], named: str) -> None:
    settings = Settings.from_env({"AzureWebJobsStorage": "UseDevelopmentStorage=true", **env})
    with pytest.raises(SettingsError, match=named.replace("[", r"\[").replace("]", r"\]")):
        configure_kinds(settings, {"http": HttpHandler()})


def test_the_http_kind_declares_its_hosts_limit() -> None:
    settings = Settings.from_env(
        {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "HTTP_MAX_CONCURRENT_PER_HOST": "4"}
    )
    handler = configure_kinds(settings, {"http": HttpHandler()}).handlers["http"]
    assert handler.limits({"url": "https://API.partner.example/v1/x?q=1"}) == [  # type: ignore[attr-defined]
        Limit("http:api.partner.example", 4)
    ]


def test_permit_settings() -> None:
    assert read_permit_settings({}, "jobs").queue_limit("jobs") is None
    shipped = read_permit_settings({"MAX_CONCURRENT": "3"}, "jobs")
    assert shipped.lease_s == 30 and shipped.queue_limit("jobs") == Limit("queue:jobs", 3)
    for bad in ({"PERMIT_LEASE_SECONDS": "90"}, {"PERMIT_LEASE_SECONDS": "5"}, {"MAX_CONCURRENT": "0"}):
        with pytest.raises(SettingsError, match=next(iter(bad))):
            read_permit_settings(bad, "jobs")
