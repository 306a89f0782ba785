"""Which containers are internal (the app's own or the Functions host's): never job input (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

HOST_PREFIX: Final = "azure-webjobs-"
"""The Functions host's containers (`azure-webjobs-hosts`, `azure-webjobs-secrets`, ...)."""


def is_host_container(name: str) -> bool:
    """True for the host's containers: `azure-webjobs-*` and `$`-prefixed ones (`$logs`, `$web`)."""
    return name.startswith("$") or name.startswith(HOST_PREFIX)


def internal_reason(container: str, own: Mapping[str, str]) -> str | None:
    """Why `container` is internal, or None. `own` maps the app's containers to their settings."""
    setting = own.get(container)
    if setting is not None:
        return f"is this app's {setting} (the app's own containers are never job input)"
    if is_host_container(container):
        return "belongs to the Functions host (azure-webjobs-* and $-prefixed containers are never job input)"
    return None


def check_input_containers(names: Iterable[str], own: Mapping[str, str]) -> list[str]:
    """Problems with `INPUT_CONTAINERS`: an internal container may not be listed."""
    problems = []
    for container in names:
        reason = internal_reason(container, own)
        if reason is not None:
            problems.append(f"INPUT_CONTAINERS lists {shown(container)}, which {reason}")
    return problems


MAX_SHOWN: Final = 80
"""Characters of a container name (or list) quoted in a message."""


def shown(name: str) -> str:
    """A container name as quoted in messages, cut to a readable length."""
    return cut(repr(name[: MAX_SHOWN + 1]))


def cut(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."
