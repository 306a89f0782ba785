"""Typed reads of app settings (environment variables), collecting problems that name the setting."""

from __future__ import annotations

import re
from collections.abc import Mapping

NAME_RE = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")


class SettingReader:
    """Reads typed values from app settings, collecting one problem (naming the setting) per bad one."""

    def __init__(self, env: Mapping[str, str], problems: list[str]) -> None:
        self.env = env
        self.problems = problems

    def text(self, name: str, default: str) -> str:
        return self.env.get(name, "").strip() or default

    def secret(self, name: str) -> str:
        """A secret: its value is never put in a problem."""
        return self.env.get(name, "").strip()

    def url(self, name: str, default: str = "") -> str:
        """An http(s) URL without a trailing slash ('' when unset and no default)."""
        value = self.text(name, default).rstrip("/")
        if value and not value.startswith(("http://", "https://")):
            self.problems.append(f"{name}={value[:80]!r} is not an http(s) URL")
            return default
        return value

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def choice(self, name: str, default: str, allowed: tuple[str, ...]) -> str:
        value = self.text(name, default).lower()
        if value not in allowed:
            self.problems.append(f"{name}={value!r} is not one of {', '.join(allowed)}")
            return default
        return value

    def integer(self, name: str, default: int, minimum: int) -> int:
        raw = self.env.get(name, "").strip()
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            self.problems.append(f"{name}={raw!r} is not an integer")
            return default
        if value < minimum:
            self.problems.append(f"{name}={value} must be >= {minimum}")
            return default
        return value

    def number(self, name: str, default: float, minimum: float) -> float:
        raw = self.env.get(name, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            self.problems.append(f"{name}={raw!r} is not a number")
            return default
        if value < minimum:
            self.problems.append(f"{name}={value:g} must be >= {minimum:g}")
            return default
        return value

    def resource_name(self, name: str, default: str, max_len: int = 63) -> str:
        value = self.text(name, default)
        if not NAME_RE.match(value) or len(value) > max_len:
            self.problems.append(
                f"{name}={value!r} is not a valid queue/container name "
                f"(3-{max_len} lower-case letters, digits and single hyphens)"
            )
            return default
        return value
