"""The declared job queues and each one's settings, read once at start-up (pure).

`JOBS_QUEUES` (comma-separated queue names; the first is the default) declares them, and
`JOBS_QUEUE` is then not read; unset, the app has one queue, `JOBS_QUEUE` (default `jobs`),
exactly as before. Each queue may override the
app's settings with `QUEUE_<NAME>_<SETTING>` (the name upper-cased, `-` as `_`):

- `CONNECTION`: the name of a connection setting (a connection string, or `<NAME>__accountName` /
  `<NAME>__queueServiceUri` identity based) of the storage account holding the queue; unset: the
  app's `AzureWebJobsStorage`.
- `JOB_TTL_SECONDS`, `MAX_ATTEMPTS`, `RETRY_BASE_SECONDS`, `RETRY_MAX_SECONDS`: as the app's.
- `KINDS`: the kinds the queue may run (comma-separated); unset: every kind.
- `HTTP_ALLOWED_HOSTS`, `HTTP_SECRETS`: the `http` kind's outbound allowance and the secret
  settings its jobs may name.
- `MAX_CONCURRENT`: at most this many of the queue's jobs run at once (enforced by the limits).
- `CONSOLE_ROLES`, `CONSOLE_GROUPS`: Entra roles / group ids whose operators may see and act on
  this queue's jobs only (shared/interfaces/console/security.py; read there).

A bad value, an unknown `QUEUE_<NAME>_...` setting of a declared queue, or a setting of a queue
that is not declared adds a problem naming the setting; the caller refuses to start.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from shared.core.errors import SettingsError
from shared.core.setting_reader import NAME_RE, SettingReader

DEFAULT_QUEUE = "jobs"
MAX_NAME = 56
"""A queue's name leaves room for `-poison` and `-parked` within storage's 63 characters (and the
host makes no poison queue for a longer one)."""
RESERVED_SUFFIXES = ("-poison", "-parked", "-ops")
SETTINGS = (
    "CONNECTION",
    "JOB_TTL_SECONDS",
    "MAX_ATTEMPTS",
    "RETRY_BASE_SECONDS",
    "RETRY_MAX_SECONDS",
    "KINDS",
    "HTTP_ALLOWED_HOSTS",
    "HTTP_SECRETS",
    "MAX_CONCURRENT",
    "CONSOLE_ROLES",
    "CONSOLE_GROUPS",
)
"""What a queue may set for itself (`QUEUE_<NAME>_<SETTING>`)."""
APP_SETTINGS = frozenset({"QUEUE_METRICS_SCHEDULE"})
"""App settings that start with `QUEUE_` but belong to no queue."""
SECRET_RE = re.compile(r"HTTP_SECRET_[A-Z0-9_]+")
CONNECTION_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class UnknownQueue(ValueError):
    """A producer or operator named a queue the app does not declare (`JOBS_QUEUES`)."""


def env_name(queue: str) -> str:
    """How a queue is spelt in setting names: upper case, `-` as `_` (pure)."""
    return queue.upper().replace("-", "_")


def setting_name(queue: str, setting: str) -> str:
    """`QUEUE_<NAME>_<SETTING>` (pure)."""
    return f"QUEUE_{env_name(queue)}_{setting}"


@dataclass(frozen=True)
class QueueSettings:
    """One declared queue: its name and what it sets for itself (None: the app's value)."""

    name: str
    default: bool = False
    """The first declared queue: producers that name none use it, and its ledger records keep
    the single-queue layout (`<id>.json`)."""
    connection: str | None = None
    job_ttl_s: float | None = None
    max_attempts: int | None = None
    retry_base_s: float | None = None
    retry_max_s: float | None = None
    kinds: tuple[str, ...] | None = None
    http_allowed_hosts: str | None = None
    """As the app's `HTTP_ALLOWED_HOSTS` (comma-separated), in its place."""
    http_secrets: tuple[str, ...] | None = None
    max_concurrent: int | None = None

    @property
    def poison(self) -> str:
        return f"{self.name}-poison"

    @property
    def parked(self) -> str:
        return f"{self.name}-parked"

    @property
    def ledger_prefix(self) -> str:
        """Where the queue's ledger records are: '' for the default queue (as before), else
        `<name>/`, so two queues may use the same job id."""
        return "" if self.default else f"{self.name}/"

    def may_run(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    def kind_refusal(self, kind: str) -> str | None:
        """Why this queue may not run `kind` (None: it may) (pure)."""
        if self.may_run(kind):
            return None
        allowed = ", ".join(self.kinds or ()) or "none"
        return f"queue {self.name} does not run kind {kind!r} ({setting_name(self.name, 'KINDS')}: {allowed})"

    def secret_refusal(self, secret: str) -> str | None:
        """Why this queue's `http` jobs may not use the secret setting `secret` (None: they may)."""
        if self.http_secrets is None or secret in self.http_secrets:
            return None
        return (
            f"secret {secret} is not allowed on queue {self.name} ({setting_name(self.name, 'HTTP_SECRETS')})"
        )

    def overrides(self) -> dict[str, str]:
        """The app settings this queue replaces, as app setting names and text, for the kinds'
        own settings readers (the `http` kind's `HTTP_ALLOWED_HOSTS`, `HTTP_SECRETS`)."""
        out: dict[str, str] = {}
        if self.http_allowed_hosts is not None:
            out["HTTP_ALLOWED_HOSTS"] = self.http_allowed_hosts
        if self.http_secrets is not None:
            out["HTTP_SECRETS"] = ",".join(self.http_secrets)
        return out


@dataclass(frozen=True)
class QueueSet:
    """The declared queues, the default first."""

    queues: tuple[QueueSettings, ...]
    declared: bool = False
    """True when `JOBS_QUEUES` declares them (else the single `JOBS_QUEUE`)."""
    fair_share: bool = True
    """`FAIR_SHARE` (`true`/`false`): with several queues, each worker process shares its job
    slots among the queues with work (shared/pipeline/fair_share.py; its figures in
    docs/performance.md)."""

    @property
    def default(self) -> QueueSettings:
        return self.queues[0]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(q.name for q in self.queues)

    def __iter__(self) -> Iterator[QueueSettings]:
        return iter(self.queues)

    def __len__(self) -> int:
        return len(self.queues)

    def get(self, name: str | None) -> QueueSettings:
        """The queue named `name` (None or '': the default); UnknownQueue otherwise."""
        if not name:
            return self.default
        for queue in self.queues:
            if queue.name == name:
                return queue
        raise UnknownQueue(f"no queue {name[:80]!r} is declared (JOBS_QUEUES: {', '.join(self.names)})")

    @classmethod
    def single(cls, name: str = DEFAULT_QUEUE) -> QueueSet:
        return cls((QueueSettings(name, default=True),))


def queue_names(env: Mapping[str, str], problems: list[str]) -> tuple[tuple[str, ...], bool]:
    """The declared queue names, default first, and whether `JOBS_QUEUES` declares them."""
    single = env.get("JOBS_QUEUE", "").strip() or DEFAULT_QUEUE
    raw = env.get("JOBS_QUEUES", "").strip()
    if not raw:
        return (single,), False
    names: list[str] = []
    for part in raw.split(","):
        name = part.strip()
        if not name:
            continue
        if not NAME_RE.match(name) or len(name) > MAX_NAME:
            problems.append(
                f"JOBS_QUEUES: {name[:80]!r} is not a valid queue name "
                f"(3-{MAX_NAME} lower-case letters, digits and single hyphens)"
            )
        elif name.endswith(RESERVED_SUFFIXES):
            problems.append(
                f"JOBS_QUEUES: {name!r} ends with one of {', '.join(RESERVED_SUFFIXES)} (the app's own)"
            )
        elif name in names:
            problems.append(f"JOBS_QUEUES names {name!r} twice")
        else:
            names.append(name)
    if not names:
        problems.append("JOBS_QUEUES names no queue (leave it unset for JOBS_QUEUE alone)")
        return (single,), False
    return tuple(names), True


def wired_names(env: Mapping[str, str]) -> tuple[str, ...]:
    """The queues function_app.py wires triggers for (at import: never raises; a bad
    `JOBS_QUEUES` is refused at start-up by `read_queues`)."""
    names, _ = queue_names(env, [])
    return names


def fair_share_wired(env: Mapping[str, str]) -> bool:
    """Whether function_app.py wires the job triggers for the fair share (`async def`, waiting
    with no thread: shared/pipeline/fair_share.py): several queues and `FAIR_SHARE` not `false`."""
    return len(wired_names(env)) > 1 and env.get("FAIR_SHARE", "").strip().lower() != "false"


def trigger_connection(env: Mapping[str, str], queue: str) -> str:
    """The `connection` of a queue's bindings: `QUEUE_<NAME>_CONNECTION`, else the app's storage."""
    return env.get(setting_name(queue, "CONNECTION"), "").strip() or "AzureWebJobsStorage"


def _split(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


def _parse_key(key: str, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """Every (queue, setting) reading of `QUEUE_...` among the declared queues (pure)."""
    readings = []
    for name in names:
        head = f"QUEUE_{env_name(name)}_"
        if key.startswith(head):
            readings.append((name, key[len(head) :]))
    return readings


def _read_one(name: str, default: bool, reader: SettingReader, env: Mapping[str, str]) -> QueueSettings:
    def key(setting: str) -> str:
        return setting_name(name, setting)

    def present(setting: str) -> bool:
        return bool(env.get(key(setting), "").strip())

    connection = reader.text(key("CONNECTION"), "") or None
    if connection is not None:
        if not CONNECTION_RE.fullmatch(connection):
            reader.problem(f"{key('CONNECTION')}={connection[:80]!r} is not a connection setting's name")
            connection = None
        elif not (
            env.get(connection, "").strip()
            or env.get(f"{connection}__accountName", "").strip()
            or env.get(f"{connection}__queueServiceUri", "").strip()
        ):
            reader.problem(
                f"{key('CONNECTION')} names {connection}, which is not set: give {connection} (a connection "
                f"string), or {connection}__accountName / {connection}__queueServiceUri (identity based)"
            )
            connection = None
    kinds = _split(env.get(key("KINDS"), "")) if present("KINDS") else None
    secrets = _split(env.get(key("HTTP_SECRETS"), "")) if present("HTTP_SECRETS") else None
    for secret in secrets or ():
        if not SECRET_RE.fullmatch(secret):
            reader.problem(
                f"{key('HTTP_SECRETS')}: {secret[:80]!r} is not an HTTP_SECRET_<NAME> setting name"
            )
    hosts = env.get(key("HTTP_ALLOWED_HOSTS"), "").strip() or None
    return QueueSettings(
        name=name,
        default=default,
        connection=connection,
        job_ttl_s=reader.number(key("JOB_TTL_SECONDS"), 0.0, 1.0) if present("JOB_TTL_SECONDS") else None,
        max_attempts=reader.integer(key("MAX_ATTEMPTS"), 0, 1) if present("MAX_ATTEMPTS") else None,
        retry_base_s=reader.number(key("RETRY_BASE_SECONDS"), 0.0, 0.0)
        if present("RETRY_BASE_SECONDS")
        else None,
        retry_max_s=reader.number(key("RETRY_MAX_SECONDS"), 0.0, 0.0)
        if present("RETRY_MAX_SECONDS")
        else None,
        kinds=kinds,
        http_allowed_hosts=hosts,
        http_secrets=secrets,
        max_concurrent=reader.integer(key("MAX_CONCURRENT"), 0, 1) if present("MAX_CONCURRENT") else None,
    )


def _stray(env: Mapping[str, str], names: tuple[str, ...], problems: list[str]) -> None:
    """A `QUEUE_...` setting that no declared queue reads: a typo or a queue left undeclared."""
    for key in sorted(env):
        if not key.startswith("QUEUE_") or key in APP_SETTINGS:
            continue
        readings = _parse_key(key, names)
        known = [(queue, setting) for queue, setting in readings if setting in SETTINGS]
        if len(known) > 1:
            problems.append(
                f"{key} could be a setting of queues {' and '.join(q for q, _ in known)}: rename one"
            )
        elif known:
            continue
        elif readings:
            problems.append(
                f"{key} is not a setting of queue {readings[0][0]} (a queue may set {', '.join(SETTINGS)})"
            )
        elif any(key.endswith("_" + setting) for setting in SETTINGS):
            problems.append(f"{key} names no declared queue (JOBS_QUEUES: {', '.join(names)})")


def read_queues(env: Mapping[str, str], problems: list[str] | None = None) -> QueueSet:
    """The declared queues and their settings. With `problems`, each bad setting is added there;
    without, SettingsError names every bad one."""
    found: list[str] = [] if problems is None else problems
    start = len(found)
    names, declared = queue_names(env, found)
    reader = SettingReader(env, found)
    queues = tuple(_read_one(name, i == 0, reader, env) for i, name in enumerate(names))
    for queue in queues:
        if (
            queue.retry_base_s is not None
            and queue.retry_max_s is not None
            and queue.retry_max_s < queue.retry_base_s
        ):
            found.append(
                f"{setting_name(queue.name, 'RETRY_MAX_SECONDS')} must be >= "
                f"{setting_name(queue.name, 'RETRY_BASE_SECONDS')}"
            )
    _stray(env, names, found)
    fair = reader.choice("FAIR_SHARE", "true", ("true", "false")) == "true"
    if problems is None and len(found) > start:
        raise SettingsError("invalid settings: " + "; ".join(found))
    return QueueSet(queues, declared, fair)
