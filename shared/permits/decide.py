"""The permits of one key as a document, and the pure decisions over it.

One document per key holds its holders (each with a lease end), its waiters (oldest job first)
and, for a rate, its recent starts. Every change is one conditional write of that document
(shared/permits/service.py), so acquire and release cost one request each when the cached copy
is current, and a release sees the waiters it must wake in the document it writes anyway.

- A holder whose lease ended (killed, frozen, cut off) no longer counts: the next decision drops it.
- A release hands the freed permit to the oldest waiter (a reservation in its name, lasting a
  third of a lease) and names it to be woken; a newcomer never overtakes an older waiter. A
  reservation that ends unused names its job (`lapsed`): its message is sent again.
- A holder renews before its lease ends; a holder whose lease ended is lost, never renewed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from shared.core.envelope import isoformat
from shared.permits.limit import Limit

RESERVED_SHARE = 1 / 3
"""A reservation (a permit a release handed to the oldest waiter) lasts this share of a lease: the
woken message is visible at once, so a live host starts the job within a poll; one that died or
froze holding it gives the permit back sooner than a lease, and the job's message is sent again."""
MAX_WAITERS = 256
"""Waiters listed in a key's document; further ones re-check at their fallback time only."""


@dataclass(frozen=True)
class Parked:
    """Where a waiting job's message is parked (the queue message's id and pop receipt)."""

    message_id: str
    pop_receipt: str


@dataclass(frozen=True)
class Holder:
    """A permit held by `owner` (an invocation) for `job` until `until`; `owner` empty: reserved
    for `job` by a release, taken by its next delivery."""

    job: str
    owner: str
    since: datetime
    until: datetime

    @property
    def reserved(self) -> bool:
        return not self.owner


@dataclass(frozen=True)
class Waiter:
    """A job waiting for a permit; `queued_at` (the job's creation) orders waiters."""

    job: str
    queued_at: datetime
    since: datetime
    parked: Parked | None = None

    def order(self) -> tuple[datetime, str]:
        return self.queued_at, self.job


@dataclass(frozen=True)
class PermitState:
    holders: tuple[Holder, ...] = ()
    waiters: tuple[Waiter, ...] = ()
    starts: tuple[datetime, ...] = ()
    grants: int = 0
    """Permits granted so far (a fencing token: each grant gets the next number)."""

    @classmethod
    def of(cls, data: dict[str, Any] | None) -> PermitState:
        if not data:
            return cls()
        holders = tuple(
            Holder(str(h["job"]), str(h.get("owner", "")), _time(h["since"]), _time(h["until"]))
            for h in data.get("holders", [])
        )
        waiters = tuple(
            Waiter(
                str(w["job"]),
                _time(w["queued_at"]),
                _time(w["since"]),
                Parked(str(w["parked"][0]), str(w["parked"][1])) if w.get("parked") else None,
            )
            for w in data.get("waiters", [])
        )
        starts = tuple(_time(s) for s in data.get("starts", []))
        return cls(holders, waiters, starts, int(data.get("grants", 0)))

    def to_data(self, key: str) -> dict[str, Any]:
        return {
            "key": key,
            "holders": [
                {"job": h.job, "owner": h.owner, "since": isoformat(h.since), "until": isoformat(h.until)}
                for h in self.holders
            ],
            "waiters": [
                {
                    "job": w.job,
                    "queued_at": isoformat(w.queued_at),
                    "since": isoformat(w.since),
                    **({"parked": [w.parked.message_id, w.parked.pop_receipt]} if w.parked else {}),
                }
                for w in self.waiters
            ],
            "starts": [isoformat(s) for s in self.starts],
            "grants": self.grants,
        }


@dataclass(frozen=True)
class Ticket:
    """Who asks: the job, its creation time (its place in line) and the invocation."""

    job: str
    queued_at: datetime
    owner: str


@dataclass(frozen=True)
class Granted:
    until: datetime
    token: int
    waited: bool
    """The job had been waiting (listed or reserved)."""


@dataclass(frozen=True)
class Refused:
    """No permit now. `retry_at`: when one may free without a release (a lease or rate window
    ending), None when only a release frees one; `held` of `limit` held, `ahead` waiters first."""

    held: int
    ahead: int
    retry_at: datetime | None
    holders: tuple[Holder, ...]
    rate: bool = False


def live(state: PermitState, limit: Limit, now: datetime) -> PermitState:
    """Drop holders and reservations whose lease ended, and starts out of the rate window."""
    holders = tuple(h for h in state.holders if h.until > now)
    starts = state.starts
    if limit.per_second is not None:
        window, _ = limit.rate_window()
        starts = tuple(s for s in starts if s > now - timedelta(seconds=window))
    else:
        starts = ()
    return replace(state, holders=holders, starts=starts)


def acquire(
    state: PermitState, limit: Limit, ticket: Ticket, now: datetime, lease_s: float
) -> tuple[PermitState, Granted | Refused]:
    """Grant `ticket` a permit, or say why not (the state then changes only by dropped entries)."""
    state = live(state, limit, now)
    until = now + timedelta(seconds=lease_s)
    mine = [h for h in state.holders if h.job == ticket.job and h.owner in ("", ticket.owner)]
    others = tuple(h for h in state.holders if h not in mine)
    listed = any(w.job == ticket.job for w in state.waiters)
    if mine:  # reserved for this job by a release (or already ours): take it
        holder = Holder(ticket.job, ticket.owner, now, until)
        granted = replace(
            state,
            holders=(*others, holder),
            waiters=tuple(w for w in state.waiters if w.job != ticket.job),
            grants=state.grants + 1,
        )
        return granted, Granted(until, granted.grants, waited=mine[0].reserved or listed)
    ahead = sum(
        1 for w in state.waiters if w.job != ticket.job and w.order() < (ticket.queued_at, ticket.job)
    )
    held = len(state.holders)
    free = limit.max_concurrent - held if limit.max_concurrent is not None else ahead + 1
    if free <= ahead:
        return state, Refused(held, ahead, _earliest(state.holders), state.holders)
    if limit.per_second is not None:
        window, count = limit.rate_window()
        if len(state.starts) >= count:
            retry = min(state.starts) + timedelta(seconds=window)
            return state, Refused(held, ahead, retry, state.holders, rate=True)
    holders = (*state.holders, Holder(ticket.job, ticket.owner, now, until)) if limit.holds else state.holders
    starts = (*state.starts, now) if limit.per_second is not None else ()
    granted = replace(
        state,
        holders=holders,
        waiters=tuple(w for w in state.waiters if w.job != ticket.job),
        starts=starts,
        grants=state.grants + 1,
    )
    return granted, Granted(until, granted.grants, waited=listed)


def wait(state: PermitState, ticket: Ticket, now: datetime, parked: Parked | None) -> PermitState:
    """List `ticket` as a waiter (oldest job first), or update where its message is parked."""
    previous = next((w for w in state.waiters if w.job == ticket.job), None)
    waiter = Waiter(ticket.job, ticket.queued_at, previous.since if previous else now, parked)
    waiters = sorted((*(w for w in state.waiters if w.job != ticket.job), waiter), key=Waiter.order)
    return replace(state, waiters=tuple(waiters[:MAX_WAITERS]))


def release(
    state: PermitState, limit: Limit, ticket: Ticket, now: datetime, lease_s: float
) -> tuple[PermitState, tuple[Waiter, ...]]:
    """Give `ticket`'s permit up and reserve each free permit for the oldest waiter: those are
    returned, to be woken (their parked message made visible)."""
    state = live(state, limit, now)
    state = replace(
        state, holders=tuple(h for h in state.holders if (h.job, h.owner) != (ticket.job, ticket.owner))
    )
    return reserve(state, limit, now, lease_s)


def reserve(
    state: PermitState, limit: Limit, now: datetime, lease_s: float
) -> tuple[PermitState, tuple[Waiter, ...]]:
    """Reserve the free permits for the oldest waiters (pure); returns the waiters to wake."""
    if limit.max_concurrent is None:
        return state, ()
    free = max(0, limit.max_concurrent - len(state.holders))
    woken = state.waiters[:free]
    until = now + timedelta(seconds=lease_s * RESERVED_SHARE)
    holders = (*state.holders, *(Holder(w.job, "", now, until) for w in woken))
    return replace(state, holders=holders, waiters=state.waiters[len(woken) :]), woken


def lapsed(before: PermitState, after: PermitState, now: datetime) -> tuple[str, ...]:
    """Jobs whose reservation ended unused between `before` (as stored) and `after` (as written):
    their woken message went to a host that never started them (pure)."""
    present = {h.job for h in after.holders} | {w.job for w in after.waiters}
    return tuple(h.job for h in before.holders if h.reserved and h.until <= now and h.job not in present)


def renew(
    state: PermitState, limit: Limit, ticket: Ticket, now: datetime, lease_s: float
) -> tuple[PermitState, datetime | None]:
    """Extend `ticket`'s lease; None when it ended (its permit may be someone else's now)."""
    state = live(state, limit, now)
    mine = next((h for h in state.holders if (h.job, h.owner) == (ticket.job, ticket.owner)), None)
    if mine is None:
        return state, None
    until = now + timedelta(seconds=lease_s)
    holders = tuple(replace(h, until=until) if h is mine else h for h in state.holders)
    return replace(state, holders=holders), until


def fallback_s(refused: Refused, now: datetime, limit: Limit, lease_s: float) -> int:
    """When a parked waiter re-checks by itself (whole seconds, >= 1): the first `max_concurrent`
    in line when a lease or the rate window may end; the rest after four leases (a release wakes
    them first). So a dead holder's permit is taken back one lease after its last renewal, with
    no waiter polling in between."""
    in_front = limit.max_concurrent is None or refused.ahead < limit.max_concurrent
    if in_front and refused.retry_at is not None:
        return max(1, int((refused.retry_at - now).total_seconds()) + 1)
    return max(1, int(lease_s * 4))


def _earliest(holders: tuple[Holder, ...]) -> datetime | None:
    return min((h.until for h in holders), default=None)


def _time(raw: str) -> datetime:
    return datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
