"""What a job handler receives and returns."""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from shared.config.settings import Settings
from shared.core.errors import NotAvailable
from shared.net import secrets as in_play
from shared.net.destinations import AllowList, BadUrl
from shared.storage.ports import Account


@dataclass(frozen=True)
class Completed:
    """The job is done; its result document is at `result_ref` ('<container>/<blob>')."""

    result_ref: str
    summary: Mapping[str, Any] = field(default_factory=dict)
    """Small facts copied into the ledger record (e.g. input_rows, engine)."""


@dataclass(frozen=True)
class Continue:
    """The work goes on elsewhere (e.g. a Spark run): check again after `delay_s`.

    The ledger keeps `state` and the job's status becomes `status`; a continuation message is
    enqueued with an initial visibility delay, and the handler is called again with
    `ctx.resume_state == state` when it arrives.
    """

    state: Mapping[str, Any]
    delay_s: int
    status: str = "offloaded"
    attempts: str = "job"
    """How transient failures count across continuations: `"job"` (the default) adds them up over
    the job's whole life (`<PREFIX>MAX_ATTEMPTS` in all); `"stage"` starts the count again at this
    continuation (each stage, e.g. each poll, gets `<PREFIX>MAX_ATTEMPTS`)."""


Outcome = Completed | Continue
T = TypeVar("T")
KEY_NAMESPACE = uuid.UUID("6f1c1f3e-34a0-4c55-9a51-8f2f0b1d2c34")
"""The namespace of idempotency keys (UUID v5 of job id, payload version and scope)."""
MAX_EFFECT_BYTES = 8 * 1024
"""Largest JSON result of one `ctx.effect` (it is kept in the ledger record)."""


def deadline_margin(function_timeout_s: float) -> float:
    """Seconds kept back from functionTimeout for the run's last writes: a tenth, 2 to 30 s (pure)."""
    return min(30.0, max(2.0, function_timeout_s / 10))


def idempotency_key(job_id: str, version: int, scope: str = "") -> str:
    """The key of a job's effect (pure): the same for every run of this payload version."""
    return str(uuid.uuid5(KEY_NAMESPACE, f"{job_id}/{version}/{scope}"))


@dataclass
class JobContext:
    """Everything a handler may use. Handlers do their own I/O through `storage`."""

    job_id: str
    kind: str
    attempt: int
    payload: Mapping[str, Any]
    settings: Settings
    storage: Account
    """The app's storage account: `storage.blobs(container)`, `.documents(container)`, `.queue(name)`."""
    log: logging.LoggerAdapter[logging.Logger]
    checkpoint: Callable[[Mapping[str, Any]], None]
    """Save progress into the ledger record (never into the queue message)."""
    resume_state: Mapping[str, Any] | None = None
    """The `Continue.state` saved earlier, when this call continues an offloaded job."""
    progress: Mapping[str, Any] | None = None
    """The last checkpoint saved by an earlier attempt of this job, if any."""
    version: int = 0
    """The payload's version: 0, then one more at each operator edit (ledger `edit_count`)."""
    effects: dict[str, Any] = field(default_factory=dict)
    """The effects of this payload version already recorded (name -> result)."""
    record_effect: Callable[[str, Any], None] | None = None
    """Saves one effect's result in the ledger record (one conditional write)."""
    deadline: float = math.inf
    """When this run must be done (`time.monotonic()`): functionTimeout less `deadline_margin`."""
    monotonic: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    """The runtime's clock (UTC): the one expiry and retries are judged by."""
    created_at: datetime | None = None
    """When the job was submitted (the envelope's `created_at`, on the runtime's clock)."""
    settings_prefix: str = ""
    """The kind's settings prefix (`ctx.secret` reads `<prefix>SECRET_<NAME>`); default `<KIND>_`."""

    def __post_init__(self) -> None:
        save = self.checkpoint

        def checkpoint(progress: Mapping[str, Any]) -> None:  # stored with the run's secrets masked
            save(masked_value(progress))

        self.checkpoint = checkpoint

    def secret(self, name: str) -> str:
        """The secret `<prefix>SECRET_<NAME>` (`name` is `NAME` or the whole setting name), read
        now: masked in everything the run stores or logs, and sent by the app's HTTP client only to
        its destinations `<prefix>SECRET_<NAME>_HOSTS` (else `DestinationRefused`, nothing sent).
        NotAvailable (poisoned: replay once set) when it is unset."""
        prefix = (self.settings_prefix or self.kind.upper().replace("-", "_") + "_") + "SECRET_"
        setting = name if name.startswith(prefix) else prefix + name
        value = self.settings.source.get(setting, "").strip()
        if not value:
            raise NotAvailable(f"app setting {setting} is not set (replay once it is)")
        try:
            hosts = AllowList.parse(self.settings.source.get(setting + "_HOSTS", ""))
        except BadUrl:
            hosts = AllowList()
        return in_play.use(setting, value, hosts)

    fence: Callable[[], None] = lambda: None
    """Call right before acting under the job's limits (e.g. the outbound call): returns only
    while its permits are provably held; raises `shared.permits.service.PermitLost` otherwise
    (do not act: the job waits for a permit again). A job with no limit: does nothing."""
    release_permits: Callable[[], None] = lambda: None
    """Give the job's permits back now, once it has acted (its call answered): the next job of
    the key starts while this one writes its result. Done anyway when `run` returns."""

    def idempotency_key(self, scope: str = "") -> str:
        """A key for an `Idempotency-Key` header: the same across retries, redeliveries, recovery
        and a plain replay of the job; a new one after an edited replay. `scope` tells a job's
        effects apart (e.g. two calls of one job)."""
        return idempotency_key(self.job_id, self.version, scope)

    def time_left(self) -> float:
        """Seconds until `deadline` (never negative)."""
        return max(0.0, self.deadline - self.monotonic())

    def effect(self, name: str, fn: Callable[[], T]) -> T:
        """Run `fn` at most once per job and payload version: its JSON result is recorded in the
        ledger record and returned by later runs without calling `fn`.

        The record is written after `fn` returns: a run that dies in between runs `fn` again.
        Make `fn` idempotent with `idempotency_key(name)` (the receiver then sees one effect)."""
        if name in self.effects:
            return self.effects[name]  # type: ignore[no-any-return]
        result = fn()
        text = json.dumps(result, separators=(",", ":"))  # TypeError: not JSON
        size = len(text)
        if size > MAX_EFFECT_BYTES:
            raise ValueError(f"effect {name!r}: result is {size} bytes of JSON, over {MAX_EFFECT_BYTES}")
        if self.record_effect is not None:  # stored with the run's secrets masked
            masker = in_play.masker()
            self.record_effect(name, json.loads(masker.text(text)) if masker else result)
        self.effects[name] = result
        return result


def masked_value(value: Mapping[str, Any]) -> Mapping[str, Any]:
    """A JSON-like mapping with the run's secrets in play masked in every string (shared/net/secrets.py)."""
    masker = in_play.masker()
    masked = masker.value(dict(value)) if masker else value
    return masked if isinstance(masked, Mapping) else value


def masked_outcome(outcome: Outcome) -> Outcome:
    """The outcome as the ledger keeps it: its summary or state with the run's secrets masked."""
    if isinstance(outcome, Completed):
        return replace(outcome, summary=masked_value(outcome.summary))
    return replace(outcome, state=masked_value(outcome.state))


class Handler(Protocol):
    """A job kind: validate its payload (pure) and run it.

    Optional: `limits(payload) -> Sequence[shared.permits.limit.Limit]` (pure): the keys the job
    is limited by (at most N at once, R a second, across all instances); the job runs only once
    it holds a permit of each, and calls `ctx.fence()` right before acting (docs/handlers.md)."""

    def validate(self, payload: Mapping[str, Any]) -> None:
        """Raise PayloadError listing every problem; no I/O."""

    def run(self, ctx: JobContext) -> Outcome:
        """Do the work. Raise PermanentError / TransientError subclasses to say what comes next."""
        ...
