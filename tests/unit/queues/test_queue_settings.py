"""Queues and their settings: JOBS_QUEUES, QUEUE_<NAME>_*, checked at start-up naming the setting."""

from __future__ import annotations

import pytest

from shared.config.settings import Settings
from shared.core.errors import SettingsError
from shared.queues import QueueSet, UnknownQueue, read_queues, setting_name, wired_names

BASE = {"AzureWebJobsStorage": "UseDevelopmentStorage=true"}


def problems_of(env: dict[str, str]) -> list[str]:
    found: list[str] = []
    read_queues(env, found)
    return found


def test_unset_is_jobs_queue_alone_as_before() -> None:
    queues = read_queues({})
    assert queues.names == ("jobs",) and not queues.declared
    assert queues.default.ledger_prefix == "" and queues.default.poison == "jobs-poison"
    assert read_queues({"JOBS_QUEUE": "work"}).names == ("work",)
    s = Settings.from_env(BASE)
    assert s.jobs_queue == "jobs" and s.queue_set.names == ("jobs",)


def test_declared_queues_the_first_is_the_default() -> None:
    queues = read_queues({"JOBS_QUEUES": " gold , silver-eu,bronze "})
    assert queues.names == ("gold", "silver-eu", "bronze") and queues.declared
    assert queues.get(None).name == "gold" and queues.get("") is queues.default
    assert queues.get("silver-eu").ledger_prefix == "silver-eu/"
    assert Settings.from_env({**BASE, "JOBS_QUEUES": "gold,silver"}).jobs_queue == "gold"
    assert Settings.from_env({**BASE, "JOBS_QUEUES": "gold", "JOBS_QUEUE": "jobs"}).jobs_queue == "gold"
    with pytest.raises(UnknownQueue, match="no queue 'tin' is declared"):
        queues.get("tin")


def test_setting_names_upper_case_hyphen_as_underscore() -> None:
    assert setting_name("silver-eu", "KINDS") == "QUEUE_SILVER_EU_KINDS"


def test_each_queue_reads_its_own_settings() -> None:
    queues = read_queues(
        {
            "JOBS_QUEUES": "gold,silver-eu",
            "QUEUE_GOLD_JOB_TTL_SECONDS": "3600",
            "QUEUE_GOLD_MAX_ATTEMPTS": "9",
            "QUEUE_GOLD_RETRY_BASE_SECONDS": "1",
            "QUEUE_GOLD_RETRY_MAX_SECONDS": "30",
            "QUEUE_GOLD_MAX_CONCURRENT": "4",
            "QUEUE_SILVER_EU_KINDS": "noop, http",
            "QUEUE_SILVER_EU_HTTP_ALLOWED_HOSTS": "127.0.0.1",
            "QUEUE_SILVER_EU_HTTP_SECRETS": "HTTP_SECRET_A",
            "PARTNER": "UseDevelopmentStorage=true",
            "QUEUE_SILVER_EU_CONNECTION": "PARTNER",
        }
    )
    gold, silver = queues.get("gold"), queues.get("silver-eu")
    assert (gold.job_ttl_s, gold.max_attempts, gold.retry_base_s, gold.retry_max_s) == (3600, 9, 1, 30)
    assert gold.max_concurrent == 4 and gold.kinds is None and gold.connection is None
    assert silver.kinds == ("noop", "http") and silver.connection == "PARTNER"
    assert silver.may_run("http") and not silver.may_run("aggregate")
    assert "QUEUE_SILVER_EU_KINDS" in (silver.kind_refusal("aggregate") or "")
    assert silver.overrides() == {"HTTP_ALLOWED_HOSTS": "127.0.0.1", "HTTP_SECRETS": "HTTP_SECRET_A"}
    assert silver.secret_refusal("HTTP_SECRET_B") and silver.secret_refusal("HTTP_SECRET_A") is None
    assert gold.secret_refusal("HTTP_SECRET_B") is None  # unset: any secret, as without queues
    assert silver.max_concurrent is None and silver.job_ttl_s is None


def test_per_queue_settings_fall_back_to_the_apps() -> None:
    s = Settings.from_env(
        {
            **BASE,
            "JOBS_QUEUES": "gold,silver",
            "MAX_ATTEMPTS": "7",
            "QUEUE_GOLD_MAX_ATTEMPTS": "2",
            "JOB_TTL_SECONDS": "7200",
            "QUEUE_SILVER_HTTP_ALLOWED_HOSTS": "example.test",
        }
    )
    gold, silver = (s.for_queue(q) for q in s.queue_set)
    assert (gold.jobs_queue, gold.max_attempts, gold.job_ttl_s) == ("gold", 2, 7200)
    assert (silver.jobs_queue, silver.max_attempts, silver.poison_queue) == ("silver", 7, "silver-poison")
    assert silver.source["HTTP_ALLOWED_HOSTS"] == "example.test" and "HTTP_ALLOWED_HOSTS" not in gold.source
    assert silver.source["AzureWebJobsStorage"] == BASE["AzureWebJobsStorage"]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"JOBS_QUEUES": "gold,Bad_Name"}, "JOBS_QUEUES: 'Bad_Name'"),
        ({"JOBS_QUEUES": "gold,gold"}, "JOBS_QUEUES names 'gold' twice"),
        ({"JOBS_QUEUES": "gold,x-poison"}, "JOBS_QUEUES: 'x-poison' ends with"),
        ({"JOBS_QUEUES": "g" * 57}, "JOBS_QUEUES: 'ggg"),
        ({"JOBS_QUEUES": " , "}, "JOBS_QUEUES names no queue"),
        ({"JOBS_QUEUES": "gold", "QUEUE_GOLD_MAX_ATTEMPTS": "0"}, "QUEUE_GOLD_MAX_ATTEMPTS=0 must be >= 1"),
        ({"JOBS_QUEUES": "gold", "QUEUE_GOLD_JOB_TTL_SECONDS": "soon"}, "QUEUE_GOLD_JOB_TTL_SECONDS='soon'"),
        ({"JOBS_QUEUES": "gold", "QUEUE_GOLD_MAX_CONCURRENT": "-1"}, "QUEUE_GOLD_MAX_CONCURRENT=-1"),
        ({"JOBS_QUEUES": "gold", "QUEUE_GOLD_MAX_CONCURRENT": "1.5"}, "QUEUE_GOLD_MAX_CONCURRENT='1.5'"),
        (
            {"JOBS_QUEUES": "gold", "QUEUE_GOLD_CONNECTION": "NOPE"},
            "QUEUE_GOLD_CONNECTION names NOPE, which is not set",
        ),
        ({"JOBS_QUEUES": "gold", "QUEUE_GOLD_CONNECTION": "a b"}, "QUEUE_GOLD_CONNECTION='a b'"),
        ({"JOBS_QUEUES": "gold", "QUEUE_GOLD_HTTP_SECRETS": "TOKEN"}, "QUEUE_GOLD_HTTP_SECRETS: 'TOKEN'"),
        (
            {"JOBS_QUEUES": "gold", "QUEUE_GOLD_MAX_ATEMPTS": "3"},
            "QUEUE_GOLD_MAX_ATEMPTS is not a setting of queue gold",
        ),
        ({"JOBS_QUEUES": "gold", "QUEUE_SILVER_KINDS": "noop"}, "QUEUE_SILVER_KINDS names no declared queue"),
        ({"QUEUE_GOLD_KINDS": "noop"}, "QUEUE_GOLD_KINDS names no declared queue (JOBS_QUEUES: jobs)"),
        (
            {
                "JOBS_QUEUES": "gold",
                "QUEUE_GOLD_RETRY_BASE_SECONDS": "9",
                "QUEUE_GOLD_RETRY_MAX_SECONDS": "3",
            },
            "QUEUE_GOLD_RETRY_MAX_SECONDS must be >= QUEUE_GOLD_RETRY_BASE_SECONDS",
        ),
    ],
)
def test_a_wrong_setting_refuses_to_start_naming_it(env: dict[str, str], named: str) -> None:
    assert any(named in problem for problem in problems_of(env)), problems_of(env)
    with pytest.raises(SettingsError, match="invalid settings"):
        Settings.from_env({**BASE, **env})


def test_the_apps_own_queue_settings_are_not_a_queues() -> None:
    assert problems_of({"JOBS_QUEUES": "metrics", "QUEUE_METRICS_SCHEDULE": "*/5 * * * * *"}) == []


def test_a_queue_setting_falling_below_the_apps_retry_base_is_refused() -> None:
    with pytest.raises(SettingsError, match="queue gold: RETRY_MAX_SECONDS"):
        Settings.from_env({**BASE, "JOBS_QUEUES": "gold", "QUEUE_GOLD_RETRY_MAX_SECONDS": "1"})


def test_a_queues_ttl_must_fit_the_ledgers_retention() -> None:
    with pytest.raises(SettingsError, match="LEDGER_RETENTION_DAYS"):
        Settings.from_env({**BASE, "JOBS_QUEUES": "gold", "QUEUE_GOLD_JOB_TTL_SECONDS": str(400 * 86400)})


def test_the_wiring_never_raises_on_a_bad_declaration() -> None:
    assert wired_names({"JOBS_QUEUES": "gold,silver"}) == ("gold", "silver")
    assert wired_names({}) == ("jobs",)
    assert wired_names({"JOBS_QUEUES": ",,"}) == ("jobs",)


def test_a_single_queue_set_by_hand() -> None:
    assert QueueSet.single("work").default.name == "work"


def test_http_secrets_limit_the_secrets_a_payload_may_name() -> None:
    from shared.core.errors import PayloadError
    from shared.core.setting_reader import SettingReader
    from shared.jobs.http_payload import parse_call, read_settings

    destinations = {"HTTP_SECRET_A_HOSTS": "example.test", "HTTP_SECRET_B_HOSTS": "example.test"}  # issue 45
    settings = Settings.from_env(
        {**BASE, **destinations, "JOBS_QUEUES": "gold", "QUEUE_GOLD_HTTP_SECRETS": "HTTP_SECRET_A"}
    )
    gold = settings.for_queue(settings.queue_set.default)
    config = read_settings(SettingReader(gold.source, []), gold)
    assert config.allowed_secrets == ("HTTP_SECRET_A",)
    payload = {"url": "https://example.test/", "headers": {"X-A": {"secret": "HTTP_SECRET_A"}}}
    assert parse_call(payload, config).headers["X-A"] == {"secret": "HTTP_SECRET_A"}
    with pytest.raises(PayloadError, match="secret HTTP_SECRET_B is not allowed here"):
        parse_call({**payload, "headers": {"X-B": {"secret": "HTTP_SECRET_B"}}}, config)
    anywhere = read_settings(SettingReader(settings.source, []), settings)
    assert anywhere.allowed_secrets is None
    parse_call({**payload, "headers": {"X-B": {"secret": "HTTP_SECRET_B"}}}, anywhere)


def test_fair_share_is_on_unless_turned_off() -> None:
    assert read_queues({"JOBS_QUEUES": "aaa,bbb"}).fair_share
    assert not read_queues({"JOBS_QUEUES": "aaa,bbb", "FAIR_SHARE": "false"}).fair_share
    assert any("FAIR_SHARE='maybe'" in p for p in problems_of({"FAIR_SHARE": "maybe"}))
