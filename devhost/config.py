"""Settings (local.settings.json), host.json options, TimeSpan parsing and %SETTING% resolution."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    """A settings file, host.json or binding cannot be used; the message says why."""


DEFAULT_LEASE_SECONDS = 600.0  # the real host receives with a fixed 10-minute visibility
LEASE_ENV = "DEVHOST_MESSAGE_LEASE_SECONDS"
DEFAULT_FUNCTION_TIMEOUT = 30 * 60.0  # non-Consumption default (func start, Premium, Dedicated)
MIN_POLLING_INTERVAL = 0.1
MAX_BATCH_SIZE = 32

_TIMESPAN = re.compile(r"^(?:(?P<days>\d+)\.)?(?P<h>\d+):(?P<m>\d+)(?::(?P<s>\d+)(?:\.(?P<frac>\d{1,7}))?)?$")


def parse_timespan(text: str) -> float:
    """Parse a .NET TimeSpan string ("00:00:02", "1.02:03:04.5", "hh:mm", bare days) into seconds."""
    raw = text.strip()
    negative = raw.startswith("-")
    body = raw[1:] if negative else raw
    if body.isdigit():
        seconds = int(body) * 86400.0
    else:
        match = _TIMESPAN.match(body)
        if not match:
            raise ConfigError(f"not a TimeSpan: {text!r} (expected e.g. '00:00:30' or '1.00:00:00')")
        hours, minutes = int(match["h"]), int(match["m"])
        secs = int(match["s"] or 0)
        if hours > 23 or minutes > 59 or secs > 59:
            raise ConfigError(f"TimeSpan component out of range: {text!r}")
        frac = float("0." + match["frac"]) if match["frac"] else 0.0
        seconds = int(match["days"] or 0) * 86400.0 + hours * 3600 + minutes * 60 + secs + frac
    return -seconds if negative else seconds


def format_timespan(seconds: float) -> str:
    """Seconds as a .NET TimeSpan string, as the host prints functionTimeout ("00:05:00")."""
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    fraction = seconds - whole
    if fraction > 0:
        text += f"{fraction:.7f}"[1:]
    return f"{days}.{text}" if days else text


def parse_duration(value: object) -> float:
    """host.json duration: a TimeSpan string, or a number of milliseconds (int or digit string)."""
    if isinstance(value, bool):
        raise ConfigError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        return float(value) / 1000.0
    if isinstance(value, str):
        if value.strip().isdigit():
            return int(value.strip()) / 1000.0
        return parse_timespan(value)
    raise ConfigError(f"not a duration: {value!r}")


def get_ci(mapping: Mapping[str, Any] | None, key: str) -> Any:
    """Case-insensitive lookup, as .NET configuration does for host.json keys."""
    if not mapping:
        return None
    lowered = key.lower()
    for k, v in mapping.items():
        if k.lower() == lowered:
            return v
    return None


@dataclass(frozen=True)
class QueueOptions:
    batch_size: int
    new_batch_threshold: int
    max_polling_interval: float  # seconds
    visibility_timeout: float  # seconds, applied when a failed message is released
    max_dequeue_count: int
    message_encoding: str  # "base64" | "none"

    @property
    def max_in_flight(self) -> int:
        return self.batch_size + self.new_batch_threshold


@dataclass(frozen=True)
class HostOptions:
    queues: QueueOptions
    function_timeout: float | None  # seconds; None = unbounded
    log_level: int
    route_prefix: str
    lease_seconds: float


_LOG_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "information": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "none": logging.CRITICAL + 10,
}


def read_json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def load_settings_values(path: Path) -> dict[str, str]:
    """`Values` of a local.settings.json file, as strings."""
    data = read_json_file(path)
    values = data.get("Values") or {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: 'Values' must be an object")
    return {
        str(k): ("" if v is None else str(v).lower() if isinstance(v, bool) else str(v))
        for k, v in values.items()
    }


def settings_http_port(path: Path) -> int | None:
    """`Host.LocalHttpPort` of a local.settings.json file, if set."""
    port = get_ci(read_json_file(path).get("Host"), "LocalHttpPort")
    return int(port) if port is not None else None


def apply_settings(values: Mapping[str, str], environ: MutableMapping[str, str]) -> list[str]:
    """Copy settings into the environment; existing variables win (as with func start)."""
    applied = []
    for key, value in values.items():
        if key not in environ:
            environ[key] = value
            applied.append(key)
    environ.setdefault("AZURE_FUNCTIONS_ENVIRONMENT", "Development")
    return applied


def _positive_int(value: Any, name: str, low: int, high: int | None = None) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"host.json {name}: not an integer: {value!r}") from exc
    if number < low or (high is not None and number > high):
        raise ConfigError(f"host.json {name}: {number} out of range [{low}, {high if high else '...'}]")
    return number


def queue_options_from(
    section: Mapping[str, Any] | None, *, development: bool, cpu_count: int
) -> QueueOptions:
    """Build queue options from host.json `extensions.queues`, with the real host's defaults."""
    batch_size = _positive_int(get_ci(section, "batchSize") or 16, "batchSize", 1, MAX_BATCH_SIZE)
    threshold_raw = get_ci(section, "newBatchThreshold")
    threshold = (
        (batch_size // 2) * cpu_count
        if threshold_raw is None
        else _positive_int(threshold_raw, "newBatchThreshold", 0)
    )
    poll_raw = get_ci(section, "maxPollingInterval")
    max_poll = (2.0 if development else 60.0) if poll_raw is None else parse_duration(poll_raw)
    if max_poll < MIN_POLLING_INTERVAL:
        raise ConfigError(f"host.json maxPollingInterval must not be less than 100 ms (got {poll_raw!r})")
    vis_raw = get_ci(section, "visibilityTimeout")
    visibility = 0.0 if vis_raw is None else parse_duration(vis_raw)
    if visibility < 0:
        raise ConfigError(f"host.json visibilityTimeout must not be negative (got {vis_raw!r})")
    max_dequeue_raw = get_ci(section, "maxDequeueCount")
    max_dequeue = 5 if max_dequeue_raw is None else _positive_int(max_dequeue_raw, "maxDequeueCount", 1)
    encoding = str(get_ci(section, "messageEncoding") or "base64").lower()
    if encoding not in ("base64", "none"):
        raise ConfigError(f"host.json messageEncoding must be 'base64' or 'none' (got {encoding!r})")
    return QueueOptions(batch_size, threshold, max_poll, visibility, max_dequeue, encoding)


def load_host_options(app_dir: Path, environ: Mapping[str, str], cpu_count: int | None = None) -> HostOptions:
    """Read DIR/host.json (missing file = all defaults)."""
    path = app_dir / "host.json"
    data = read_json_file(path) if path.exists() else {}
    extensions = get_ci(data, "extensions") or {}
    development = environ.get("AZURE_FUNCTIONS_ENVIRONMENT", "Development").lower() == "development"
    queues = queue_options_from(
        get_ci(extensions, "queues"), development=development, cpu_count=cpu_count or os.cpu_count() or 1
    )
    timeout_raw = get_ci(data, "functionTimeout")
    if timeout_raw is None:
        timeout: float | None = DEFAULT_FUNCTION_TIMEOUT
    else:
        timeout = parse_timespan(str(timeout_raw))
        if timeout < 0:
            timeout = None  # "-1": unbounded
    level_name = str(get_ci(get_ci(get_ci(data, "logging"), "logLevel"), "default") or "Information")
    http = get_ci(extensions, "http") or {}
    prefix = get_ci(http, "routePrefix")
    lease_raw = environ.get(LEASE_ENV)
    lease = float(lease_raw) if lease_raw else DEFAULT_LEASE_SECONDS
    if lease < 1:
        raise ConfigError(f"{LEASE_ENV} must be at least 1 second (got {lease_raw!r})")
    return HostOptions(
        queues=queues,
        function_timeout=timeout,
        log_level=_LOG_LEVELS.get(level_name.lower(), logging.INFO),
        route_prefix=("api" if prefix is None else str(prefix)).strip("/"),
        lease_seconds=lease,
    )


THREAD_COUNT_SETTING = "PYTHON_THREADPOOL_THREAD_COUNT"


def sync_thread_count(environ: Mapping[str, str], cpu_count: int | None = None) -> int:
    """Threads of the worker's pool for sync functions: the app setting, else min(32, cpus + 4)."""
    raw = environ.get(THREAD_COUNT_SETTING)
    if raw is None or not raw.strip():
        return min(32, (cpu_count or os.cpu_count() or 1) + 4)
    try:
        count = int(raw.strip())
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(f"app setting {THREAD_COUNT_SETTING} must be a positive integer (got {raw!r})")
    return count


_SETTING_REF = re.compile(r"%([^%]+)%")


def resolve_setting_refs(text: str, environ: Mapping[str, str], what: str) -> str:
    """Replace each %NAME% with the app setting NAME; a missing setting is a clear error."""

    def repl(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise ConfigError(f"{what}: app setting {name!r} (referenced as %{name}%) is not defined")
        return environ[name]

    return _SETTING_REF.sub(repl, text)
