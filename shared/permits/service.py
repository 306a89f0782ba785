"""Permits across instances: acquire, renew, release and wait, each a conditional write of the
key's document (shared/permits/decide.py decides, the store keeps, the parking wakes).

Cost (storage requests): acquire 1 and release 1 when this process's copy of the key's document
is current (2 when it has none: a read first; a lost race adds a read and a write). A job that
waits: the refused acquire, its message parked (1), its place written (1) and a note for the
console (1); a release that hands the permit on wakes the waiter (1). A job with no limit: none.
Changes asked by several threads of a process at once are one write (a group commit).

Fencing: a holder acts (the `http` kind's call) only inside its lease as its own monotonic clock
measures it from before the grant, less `FENCE_MARGIN` of the lease (writers' clock skew, the
call's start): past that it renews first, and a lease that ended is lost (`PermitLost`), never
renewed, since the permit may be another job's by then.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from shared.core.documents import Conflict, Document
from shared.core.envelope import isoformat
from shared.core.errors import StorageThrottled
from shared.core.timers import Clock, Timer, Timers
from shared.permits import decide
from shared.permits.decide import Granted, Holder, Parked, PermitState, Refused, Ticket
from shared.permits.limit import Limit
from shared.permits.parked_messages import Parking
from shared.permits.store import PermitStore

log = logging.getLogger("jobs.permits")
R = TypeVar("R")
FENCE_MARGIN = 1 / 6
"""Part of the lease a holder keeps back: it acts only within lease x (1 - FENCE_MARGIN) of the grant."""
MAX_TRIES = 12
"""Conditional writes tried on one key before giving up (PermitsBusy: the job re-checks later)."""


class PermitLost(Exception):
    """This job's permit ended (its lease ran out while the process was stopped or cut off) and may
    be another job's now: do not act on it; the job waits for a permit again."""


class PermitsBusy(StorageThrottled):
    """A key's document kept changing under us: the job re-checks a little later."""


@dataclass
class HeldPermit:
    limit: Limit
    until_mono: float
    """When the lease ends by this process's monotonic clock (measured from before the grant)."""
    token: int
    waited: bool


@dataclass(frozen=True)
class Waiting:
    """A job refused by `limit`: why, and when its parked message re-checks by itself."""

    limit: Limit
    refused: Refused
    delay_s: int

    def reason(self) -> str:
        return describe(self.limit, self.refused.holders, self.refused.rate)


def describe(limit: Limit, holders: Sequence[Holder], rate: bool = False) -> str:
    """`waiting for a permit of http:api.partner.example: 4 of 4 held by jobs a, b, c, d`."""
    if rate:
        return f"waiting for a permit of {limit.key}: {limit.per_second:g} a second started already"
    names = ", ".join(h.job + (" (reserved)" if h.reserved else "") for h in holders[:8])
    more = f" and {len(holders) - 8} more" if len(holders) > 8 else ""
    return (
        f"waiting for a permit of {limit.key}: {len(holders)} of {limit.max_concurrent} held by {names}{more}"
    )


@dataclass
class _Ask:
    """One thread's change of a key's document, done by whichever thread writes it."""

    decision: Callable[[PermitState], tuple[PermitState, Any]]
    settled: Callable[[Any], bool]
    done: bool = False
    result: Any = None
    error: BaseException | None = None


class Permits:
    """The permits of this process: one lock and one cached document per key; the changes its
    threads ask for meanwhile go together in the next write (they never race each other)."""

    def __init__(
        self,
        store: PermitStore,
        parking: Parking,
        clock: Clock,
        timers: Timers,
        lease_s: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
        parking_of: Callable[[str], Parking] | None = None,
    ) -> None:
        self.store = store
        self.parking = parking
        self.parking_of: Callable[[str], Parking] = parking_of or (lambda _job: parking)
        """Where a job's message is parked, by its name: with several queues a limit's waiters
        come from any of them, and each is parked, woken and sent again on its own queue."""
        self.clock = clock
        self.timers = timers
        self.lease_s = lease_s
        self.monotonic = monotonic
        self._docs: dict[str, Document | None] = {}
        self._asks: dict[str, list[_Ask]] = {}
        """Changes asked of each key, waiting for the key's lock: the holder writes them together."""
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    # -- one key's document -----------------------------------------------------------------

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def change(
        self, key: str, decision: Callable[[PermitState], tuple[PermitState, R]], settled: Callable[[R], bool]
    ) -> R:
        """Apply `decision` to the key's document with one conditional write (none when nothing
        changes). A result from a cached copy that writes nothing is trusted only when `settled`;
        else the stored document is read and decided on again. Changes asked by this process's
        threads while a write is under way go together in the next write (a group commit): a
        release waits for the write under way at most, not for a queue of writes."""
        ask = _Ask(decision, settled)
        lapsed: tuple[str, ...] = ()
        with self._guard:
            self._asks.setdefault(key, []).append(ask)
        asked = time.monotonic()
        with self._lock(key):
            if not ask.done:
                with self._guard:
                    batch = self._asks.pop(key, [])
                locked = time.monotonic()
                tries, lapsed = self._apply(key, batch)
                log.debug(
                    "permits of %s: %d changes, %d tries, %.3fs waiting, %.3fs writing",
                    key, len(batch), tries, locked - asked, time.monotonic() - locked,
                )  # fmt: skip
        if lapsed:  # sent again by the thread that wrote, outside the key's lock
            self._lapsed(lapsed)
        if ask.error is not None:
            raise ask.error
        return cast(R, ask.result)

    def _apply(self, key: str, batch: list[_Ask]) -> tuple[int, tuple[str, ...]]:
        """Decide every asked change in turn on one copy of the document and write it once.
        Returns the tries and the jobs whose reservation the write ended unused."""
        try:
            fresh = key not in self._docs
            doc = self.store.read(key) if fresh else self._docs[key]
            for tries in range(1, MAX_TRIES + 1):
                stored = PermitState.of(doc.data if doc is not None else None)
                state, results = stored, []
                for ask in batch:
                    state, result = ask.decision(state)
                    results.append(result)
                if (
                    state == stored
                    and not fresh
                    and not all(a.settled(r) for a, r in zip(batch, results, strict=True))
                ):
                    doc, fresh = self.store.read(key), True
                    continue
                if state != stored:
                    try:
                        doc = self.store.write(key, state.to_data(key), doc)
                    except Conflict as conflict:
                        doc = conflict.current if conflict.read_back else self.store.read(key)
                        fresh = True
                        continue
                self._docs[key] = doc
                for ask, result in zip(batch, results, strict=True):
                    ask.result, ask.done = result, True
                return tries, decide.lapsed(stored, state, self.clock()) if state != stored else ()
            self._docs.pop(key, None)
            failure: BaseException = PermitsBusy(
                f"permits of {key}: the document kept changing ({MAX_TRIES} tries); re-checking later"
            )
        except Exception as exc:  # a storage failure: every change of the batch meets it
            self._docs.pop(key, None)
            failure = exc
        for ask in batch:
            ask.error, ask.done = failure, True
        return MAX_TRIES, ()

    def _lapsed(self, jobs: Sequence[str]) -> None:
        """Jobs whose reservation this write ended unused (the woken message was taken by a host
        that died or froze before it started the job): put a copy of each job's parked message
        back, visible now, so the job does not wait out the dead host's 10-minute message lease.
        Best effort: a copy the job does not need meets its record and is acknowledged."""
        for job in jobs:
            try:
                note = self.store.waiting_note(job)
                body = note.get("body") if note else None
                if isinstance(body, str):
                    self.parking_of(job).park(body, 0)
                    log.warning("job %s: its reserved permit went unused; its message is sent again", job)
            except Exception as exc:
                log.warning("job %s: reserved permit unused, message not sent again (%s)", job, exc)

    def state(self, key: str) -> PermitState:
        """The key's permits as stored now (one read)."""
        doc = self.store.read(key)
        return PermitState.of(doc.data if doc is not None else None)

    # -- acquire, wait, release ---------------------------------------------------------------

    def acquire(self, limits: Sequence[Limit], ticket: Ticket) -> Hold | Waiting:
        """Take a permit of every limit (in key order), or give those taken back and say why not."""
        held: list[HeldPermit] = []
        for limit in sorted(limits, key=lambda lim: lim.key):
            started = self.monotonic()
            result = self.change(
                limit.key,
                lambda s, lim=limit: decide.acquire(s, lim, ticket, self.clock(), self.lease_s),  # type: ignore[misc]
                lambda r: isinstance(r, Granted),
            )
            if isinstance(result, Refused):
                Hold(self, ticket, held).release()
                return Waiting(limit, result, decide.fallback_s(result, self.clock(), limit, self.lease_s))
            held.append(HeldPermit(limit, started + self.lease_s, result.token, result.waited))
        return Hold(self, ticket, held)  # a waiter's note is cleared at its release, off the way to its start

    def wait(self, waiting: Waiting, ticket: Ticket, body: str) -> None:
        """Park the job's message (visible at its fallback time), take its place in line and note
        why it waits (with the message's body, sent again if a reservation for it goes unused). A
        permit that freed meanwhile (a lease ended) is reserved for the oldest waiter at once and
        that waiter woken. The note is cleared when the job gives its permits back."""
        limit = waiting.limit
        parked = self.parking_of(ticket.job).park(body, waiting.delay_s)
        now = self.clock()

        def listed(state: PermitState) -> tuple[PermitState, tuple[decide.Waiter, ...]]:
            return decide.reserve(
                decide.wait(decide.live(state, limit, now), ticket, now, parked), limit, now, self.lease_s
            )

        woken = self.change(limit.key, listed, lambda _r: False)
        self.store.note_waiting(
            ticket.job,
            {
                "key": limit.key,
                "max_concurrent": limit.max_concurrent,
                "per_second": limit.per_second,
                "since": isoformat(now),
                "reason": waiting.reason(),
                "recheck_in_s": waiting.delay_s,
                "body": body,
            },
        )
        self.wake(woken)

    def wake(self, woken: Sequence[decide.Waiter]) -> None:
        for waiter in woken:
            if waiter.parked is not None:
                self.parking_of(waiter.job).wake(waiter.parked)

    def release_one(self, permit: HeldPermit, ticket: Ticket) -> None:
        limit = permit.limit
        if not limit.holds:
            return
        woken = self.change(
            limit.key, lambda s: decide.release(s, limit, ticket, self.clock(), self.lease_s), lambda _r: True
        )
        self.wake(woken)

    def renew_one(self, permit: HeldPermit, ticket: Ticket) -> bool:
        """Extend one lease; False when it had ended (the permit is lost)."""
        started = self.monotonic()
        until = self.change(
            permit.limit.key,
            lambda s: decide.renew(s, permit.limit, ticket, self.clock(), self.lease_s),
            lambda r: r is None,
        )
        if until is None:
            return False
        permit.until_mono = started + self.lease_s
        return True

    def waiting_reason(self, job: str) -> dict[str, Any] | None:
        """Why `job` waits, for the console and the API (2 reads), or None when it does not."""
        note = self.store.waiting_note(job)
        if note is None:
            return None
        key = str(note.get("key", ""))
        state = self.state(key)
        reserved = any(h.job == job and h.reserved for h in state.holders)
        if not reserved and not any(w.job == job for w in state.waiters):
            return None
        holders = [h for h in state.holders if h.until > self.clock()]
        limit = Limit(key, note.get("max_concurrent"), note.get("per_second"))
        return {
            "key": key,
            "since": note.get("since"),
            "reason": f"a permit of {key} is reserved for it: it starts at its next delivery"
            if reserved
            else describe(limit, holders),
            "held": len(holders),
            "max_concurrent": limit.max_concurrent,
            "holders": [{"job": h.job, "owner": h.owner, "until": isoformat(h.until)} for h in holders[:8]],
            "waiters": len(state.waiters),
        }


@dataclass
class Hold:
    """The permits one job holds while it runs: renewed on a timer, checked before acting,
    given back by `release()` (which wakes the oldest waiters)."""

    permits: Permits
    ticket: Ticket
    held: list[HeldPermit]
    lost: bool = False
    _timer: Timer | None = field(default=None, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _released: bool = False

    @property
    def holding(self) -> list[HeldPermit]:
        return [p for p in self.held if p.limit.holds]

    def start(self) -> None:
        """Renew every third of the lease while the job runs."""
        with self._lock:
            if self.holding and not self._released:
                self._timer = self.permits.timers.call_later(self.permits.lease_s / 3, self._beat)

    def _beat(self) -> None:
        with self._lock:
            if self._released or self.lost:
                return
            try:
                self._renew_all()
            except PermitLost:
                log.warning("job %s: permit lost (its lease ended); it will not act on it", self.ticket.job)
                return
            except Exception as exc:  # the next beat tries again, inside the lease
                log.warning("job %s: permit renewal failed (%s); retrying", self.ticket.job, exc)
            self._timer = self.permits.timers.call_later(self.permits.lease_s / 3, self._beat)

    def _renew_all(self) -> None:
        for permit in self.holding:
            if not self.permits.renew_one(permit, self.ticket):
                self.lost = True
                raise PermitLost(
                    f"job {self.ticket.job}: its permit of {permit.limit.key} ended and may be another job's"
                )

    def fence(self) -> None:
        """Call right before acting on the permits (the outbound call): returns only while every
        lease is provably ours; renews first when the margin is reached; PermitLost when one ended."""
        with self._lock:
            if self.lost:
                raise PermitLost(f"job {self.ticket.job}: its permit ended and may be another job's")
            margin = self.permits.lease_s * FENCE_MARGIN
            if any(self.permits.monotonic() >= p.until_mono - margin for p in self.holding):
                self._renew_all()

    def release(self) -> None:
        """Give every permit back (best effort: a failed release ends with its lease)."""
        with self._lock:
            if self._released:
                return
            self._released = True
            if self._timer is not None:
                self._timer.cancel()
        for permit in self.held:
            try:
                self.permits.release_one(permit, self.ticket)
            except Exception as exc:
                log.warning(
                    "job %s: permit of %s not released (%s); it ends with its lease",
                    self.ticket.job,
                    permit.limit.key,
                    exc,
                )
        if any(p.waited for p in self.held):  # after the wakes: the next job's start does not wait on it
            try:
                self.permits.store.clear_waiting(self.ticket.job)
            except Exception as exc:  # the console then shows no reason: it checks the key's document
                log.info("job %s: its waiting note not cleared (%s)", self.ticket.job, exc)


__all__ = ["Granted", "Hold", "Parked", "PermitLost", "Permits", "PermitsBusy", "Ticket", "Waiting"]
