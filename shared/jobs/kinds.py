"""A deployment's kinds, configured at start-up: each kind's own settings and its retry policy.

A handler may declare (both optional):
- `settings_prefix` (default: the kind's name upper-cased and `_`): where its settings live;
- `configure(reader, settings) -> Handler`: read its typed settings under that prefix with the
  `SettingReader` (each bad value adds a problem naming the setting) and return the configured
  handler; `retry: RetryPolicy`: the kind's own default policy.

Every kind's retry policy is `<PREFIX>MAX_ATTEMPTS`, `<PREFIX>RETRY_BASE_SECONDS`,
`<PREFIX>RETRY_MAX_SECONDS` and `<PREFIX>RETRY_JITTER` (true/false), defaulting to the kind's
`retry`, else to the app's `MAX_ATTEMPTS` / `RETRY_BASE_SECONDS` / `RETRY_MAX_SECONDS`.
A problem in any of them refuses to start (SettingsError naming every bad setting), as does a
secret `<PREFIX>SECRET_<NAME>` without its destinations `<PREFIX>SECRET_<NAME>_HOSTS`
(shared/jobs/outbound.py). The app's storage endpoints are registered with the outbound guard here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared.config.settings import Settings
from shared.core.backoff import RetryPolicy
from shared.core.errors import SettingsError
from shared.core.setting_reader import SettingReader
from shared.jobs.base import Handler
from shared.jobs.outbound import read_secrets, register_app_endpoints


@dataclass(frozen=True)
class Kinds:
    """The configured handlers and each kind's retry policy."""

    handlers: Mapping[str, Handler]
    retry: Mapping[str, RetryPolicy]


def app_policy(settings: Settings) -> RetryPolicy:
    """The app's default retry policy (MAX_ATTEMPTS, RETRY_BASE_SECONDS, RETRY_MAX_SECONDS)."""
    return RetryPolicy(settings.max_attempts, settings.retry_base_s, settings.retry_max_s)


def prefix_of(kind: str, handler: Handler) -> str:
    declared = getattr(handler, "settings_prefix", None)
    return declared if isinstance(declared, str) else kind.upper().replace("-", "_") + "_"


def read_policy(reader: SettingReader, prefix: str, default: RetryPolicy) -> RetryPolicy:
    """A kind's retry policy from its settings, checked (problems name the settings)."""
    jitter = reader.choice(f"{prefix}RETRY_JITTER", "true" if default.jitter else "false", ("true", "false"))
    policy = RetryPolicy(
        attempts=reader.integer(f"{prefix}MAX_ATTEMPTS", default.attempts, 1),
        base_s=reader.number(f"{prefix}RETRY_BASE_SECONDS", default.base_s, 0.0),
        cap_s=reader.number(f"{prefix}RETRY_MAX_SECONDS", default.cap_s, 0.0),
        jitter=jitter == "true",
    )
    for problem in policy.problems(prefix):
        reader.problem(problem)
    return policy


def configure_kinds(settings: Settings, handlers: Mapping[str, Handler]) -> Kinds:
    """Read and check every kind's settings (start-up); SettingsError names every bad one."""
    problems: list[str] = []
    reader = SettingReader(settings.source, problems)
    register_app_endpoints(settings)
    configured: dict[str, Handler] = {}
    policies: dict[str, RetryPolicy] = {}
    for kind, handler in handlers.items():
        prefix = prefix_of(kind, handler)
        configure = getattr(handler, "configure", None)
        configured[kind] = configure(reader, settings) if callable(configure) else handler
        declared = getattr(handler, "retry", None)
        default = declared if isinstance(declared, RetryPolicy) else app_policy(settings)
        policies[kind] = read_policy(reader, prefix, default)
        read_secrets(reader, prefix)  # its secrets' destinations, whether or not it reads them
    if problems:
        raise SettingsError("invalid settings: " + "; ".join(dict.fromkeys(problems)))
    return Kinds(configured, policies)
