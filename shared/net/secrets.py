"""Secrets in play: the secret values a run has read, where each may go, and masking them.

A job's run is inside `secrets_in_play()` (shared/pipeline/processing.py). A secret read for it
(`use(name, value, destinations)`: `ctx.secret(...)`, the `http` kind's secret headers) is then
- sent by the app's HTTP client only to its destinations (`<NAME>_HOSTS`): a request, or a redirect,
  that carries its value elsewhere is refused (`DestinationRefused`, nothing sent);
- masked (shared/net/masking.py) in every error the client raises, in every log record made in the
  run (a log record factory), and in the exception that ends the run (its reason, the ledger's
  history, the retry's error, the span), before anything is cut.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from shared.net.destinations import AllowList
from shared.net.masking import Masker


@dataclass(frozen=True)
class SecretUse:
    """A secret read by a run: the setting's name, its value, where it may be sent."""

    name: str
    value: str = field(repr=False)
    destinations: AllowList


@dataclass
class InPlay:
    """The secrets of one run."""

    uses: list[SecretUse] = field(default_factory=list)
    _masker: Masker | None = None

    def add(self, use: SecretUse) -> None:
        if all(u.value != use.value or u.name != use.name for u in self.uses):
            self.uses.append(use)
            self._masker = None

    @property
    def masker(self) -> Masker:
        if self._masker is None:
            self._masker = Masker(u.value for u in self.uses)
        return self._masker


_scope: contextvars.ContextVar[InPlay | None] = contextvars.ContextVar("secrets_in_play", default=None)
_factory_installed = False


def current() -> InPlay | None:
    return _scope.get()


def uses() -> tuple[SecretUse, ...]:
    scope = _scope.get()
    return tuple(scope.uses) if scope is not None else ()


def masker() -> Masker:
    """The masker of the secrets in play (an empty one outside a run)."""
    scope = _scope.get()
    return scope.masker if scope is not None else Masker()


def use(name: str, value: str, destinations: AllowList) -> str:
    """Note a secret read for this run (masked, destinations enforced); returns the value."""
    scope = _scope.get()
    if scope is not None:
        scope.add(SecretUse(name, value, destinations))
    return value


def mask_exception(exc: BaseException, masked: Masker) -> None:
    """Mask the exception's text arguments in place (its message becomes the job's reason)."""
    if not masked:
        return
    exc.args = tuple(masked.text(a) if isinstance(a, str) else a for a in exc.args)
    problems = getattr(exc, "problems", None)
    if isinstance(problems, list):
        exc.problems = [masked.text(p) if isinstance(p, str) else p for p in problems]  # type: ignore[attr-defined]


@contextlib.contextmanager
def secrets_in_play() -> Iterator[InPlay]:
    """A run's scope: secrets read inside are enforced and masked (the ending exception too)."""
    _install_log_masking()
    scope = InPlay()
    token = _scope.set(scope)
    try:
        yield scope
    except BaseException as exc:
        mask_exception(exc, scope.masker)
        raise
    finally:
        _scope.reset(token)


def _install_log_masking() -> None:
    """Mask the secrets in play in every log record made while they are (installed once)."""
    global _factory_installed
    if _factory_installed:
        return
    _factory_installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        scope = _scope.get()
        if scope is not None and scope.uses:
            try:
                text = record.getMessage()
            except Exception:  # a bad format string: keep the template only
                text = str(record.msg)
            record.msg, record.args = scope.masker.text(text), ()
        return record

    logging.setLogRecordFactory(factory)
