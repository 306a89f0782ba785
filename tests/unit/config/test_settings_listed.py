"""docs/settings.md names every setting the app reads at start-up (its own and every kind's), and
local.settings.sample.json lists every setting of the `http` kind (its own and its retry policy).

The names are the ones the code actually reads: the start-up (`Settings.from_env`, then each
kind's `configure` and retry policy, `configure_kinds`) runs over a mapping that records every key
asked for, so a setting added to the code without its line in the docs or the sample fails here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.config.settings import Settings
from shared.jobs import registry
from shared.jobs.kinds import configure_kinds, prefix_of

ROOT = Path(__file__).resolve().parents[3]
SETTINGS_DOC = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
SAMPLE = json.loads((ROOT / "local.settings.sample.json").read_text(encoding="utf-8"))["Values"]


class Recording(dict[str, str]):
    """App settings that remember every name read."""

    def __init__(self, values: dict[str, str]) -> None:
        super().__init__(values)
        self.read: set[str] = set()
        self.listed = False

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:
        """Listing is allowed for what is named by a pattern: a kind's `<PREFIX>SECRET_<NAME>`
        (and its `_HOSTS`), and the queues' check (a `QUEUE_*` setting no declared queue reads is
        refused); every value is still read by its name, and recorded."""
        self.listed = True
        return super().__iter__()


def read_at_start_up(**more: str) -> set[str]:
    env = Recording({"AzureWebJobsStorage": "UseDevelopmentStorage=true", **more})
    configure_kinds(Settings.from_env(env), registry(enable_test_kinds=True))
    return env.read


def test_what_the_start_up_finds_by_listing_is_a_secret_and_its_destinations_only() -> None:
    read = read_at_start_up(
        HTTP_SECRET_PARTNER="v", HTTP_SECRET_PARTNER_HOSTS="partner.example", UNRELATED_SETTING="x"
    )
    assert {"HTTP_SECRET_PARTNER", "HTTP_SECRET_PARTNER_HOSTS"} <= read
    assert "UNRELATED_SETTING" not in read


def documented(name: str) -> bool:
    """In the docs' tables as itself, or as a kind's `<KIND>_<SUFFIX>` row, or an endpoint's
    `__suffix` under AzureWebJobsStorage."""
    if f"`{name}`" in SETTINGS_DOC or re.search(rf"`{re.escape(name)}`", SETTINGS_DOC):
        return True
    kinds = {prefix_of(kind, handler) for kind, handler in registry(enable_test_kinds=True).items()}
    for prefix in kinds:
        if name.startswith(prefix) and f"`<KIND>_{name[len(prefix) :]}`" in SETTINGS_DOC:
            return True
    if name.startswith("QUEUE_JOBS_") and f"`QUEUE_<NAME>_{name[len('QUEUE_JOBS_') :]}`" in SETTINGS_DOC:
        return True  # the single queue `jobs` reads its own settings
    head, _, tail = name.partition("__")
    return head == "AzureWebJobsStorage" and bool(tail) and f"`__{tail}`" in SETTINGS_DOC


def test_the_start_up_reads_the_http_kinds_settings_and_every_kinds_retry_policy() -> None:
    read = read_at_start_up()
    assert {"HTTP_ALLOWED_HOSTS", "HTTP_FOLLOW_REDIRECTS", "HTTP_MAX_ATTEMPTS", "HTTP_RETRY_JITTER"} <= read
    assert {"AGGREGATE_MAX_ATTEMPTS", "NOOP_RETRY_MAX_SECONDS", "MAX_ATTEMPTS", "JOBS_QUEUE"} <= read


def test_docs_settings_names_every_setting_read_at_start_up() -> None:
    missing = sorted(name for name in read_at_start_up() if not documented(name))
    assert not missing, f"docs/settings.md does not name: {missing}"


def test_the_sample_lists_every_setting_of_the_http_kind() -> None:
    http = sorted(name for name in read_at_start_up() if name.startswith("HTTP_"))
    assert len(http) >= 9
    missing = [name for name in http if name not in SAMPLE]
    assert not missing, f"local.settings.sample.json does not list: {missing}"


def test_the_samples_values_start_the_app_as_the_defaults_do() -> None:
    """An empty value is the default (a kind's retry policy: the app's)."""
    values = {**SAMPLE, "AzureWebJobsStorage": "UseDevelopmentStorage=true"}
    sample = configure_kinds(Settings.from_env(values), registry())
    plain = configure_kinds(
        Settings.from_env(
            {
                "AzureWebJobsStorage": "UseDevelopmentStorage=true",
                **{k: v for k, v in SAMPLE.items() if not k.startswith("HTTP_")},
            }
        ),
        registry(),
    )
    assert sample.retry == plain.retry
    assert sample.handlers["http"].config == plain.handlers["http"].config  # type: ignore[attr-defined]
