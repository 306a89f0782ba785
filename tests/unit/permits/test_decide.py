"""The permits' pure decisions, on a fake clock with the shipped lease (30 s) and ratios."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.permits import decide
from shared.permits.decide import Granted, Parked, PermitState, Refused, Ticket
from shared.permits.limit import Limit, LimitError
from shared.permits.limit_settings import read_permit_settings

LEASE = read_permit_settings({}, "jobs").lease_s  # the shipped lease
T0 = datetime(2026, 1, 1, tzinfo=UTC)
FOUR = Limit("http:api.partner.example", 4)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def ticket(n: int, created_s: float = 0.0) -> Ticket:
    return Ticket(f"job-{n}", at(created_s + n / 1000), f"inst/{n}")


def take(state: PermitState, limit: Limit, t: Ticket, now: float) -> tuple[PermitState, Granted | Refused]:
    return decide.acquire(state, limit, t, at(now), LEASE)


def test_shipped_lease_is_within_the_60_s_recovery_bound() -> None:
    assert 15 <= LEASE <= 60


def test_at_most_n_granted_then_refused_with_the_holders() -> None:
    state = PermitState()
    for n in range(4):
        state, got = take(state, FOUR, ticket(n), 0)
        assert isinstance(got, Granted)
        assert got.token == n + 1
    state, got = take(state, FOUR, ticket(4), 0)
    assert isinstance(got, Refused)
    assert got.held == 4
    assert [h.job for h in got.holders] == ["job-0", "job-1", "job-2", "job-3"]
    assert got.retry_at == at(LEASE)


def test_a_dead_holders_permit_is_free_once_its_lease_ends_and_not_before() -> None:
    state = PermitState()
    for n in range(4):
        state, _ = take(state, FOUR, ticket(n), 0)
    _, before = take(state, FOUR, ticket(9), LEASE - 0.001)
    assert isinstance(before, Refused)
    after_state, after = take(state, FOUR, ticket(9), LEASE)
    assert isinstance(after, Granted)
    assert len(after_state.holders) == 1  # the four dead ones are dropped


def test_renewal_keeps_the_permit_and_a_lapsed_lease_is_lost_not_renewed() -> None:
    state, _ = take(PermitState(), FOUR, ticket(0), 0)
    state, until = decide.renew(state, FOUR, ticket(0), at(LEASE / 3), LEASE)
    assert until == at(LEASE / 3 + LEASE)
    _, lost = decide.renew(state, FOUR, ticket(0), at(LEASE / 3 + LEASE), LEASE)
    assert lost is None
    # a frozen holder (90 s) whose permit went to another job cannot renew it
    state, _ = take(PermitState(), Limit("k", 1), ticket(0), 0)
    state, other = take(state, Limit("k", 1), ticket(1), 90)
    assert isinstance(other, Granted)
    _, woke = decide.renew(state, Limit("k", 1), ticket(0), at(90), LEASE)
    assert woke is None


def test_release_hands_the_permit_to_the_oldest_waiter_and_newcomers_do_not_overtake() -> None:
    limit = Limit("k", 1)
    state, _ = take(PermitState(), limit, ticket(0), 0)
    old, new = ticket(1, created_s=-10), ticket(2, created_s=-5)
    state = decide.wait(state, new, at(1), Parked("m2", "r2"))
    state = decide.wait(state, old, at(2), Parked("m1", "r1"))
    assert [w.job for w in state.waiters] == ["job-1", "job-2"]
    state, woken = decide.release(state, limit, ticket(0), at(3), LEASE)
    assert [w.parked for w in woken] == [Parked("m1", "r1")]
    # a newcomer (and the younger waiter) cannot take the reserved permit
    _, late = take(state, limit, ticket(7), 3.1)
    assert isinstance(late, Refused)
    _, younger = take(state, limit, new, 3.1)
    assert isinstance(younger, Refused) and younger.ahead == 0
    state, got = take(state, limit, old, 3.2)
    assert isinstance(got, Granted) and got.waited
    assert [h.job for h in state.holders] == ["job-1"] and [w.job for w in state.waiters] == ["job-2"]


def test_an_unclaimed_reservation_ends_with_a_third_of_a_lease_and_names_its_job() -> None:
    limit = Limit("k", 1)
    reserved_s = LEASE * decide.RESERVED_SHARE  # 10 s of the shipped 30
    state, _ = take(PermitState(), limit, ticket(0), 0)
    state = decide.wait(state, ticket(1), at(0), Parked("m1", "r1"))
    state, _ = decide.release(state, limit, ticket(0), at(1), LEASE)
    after, early = take(state, limit, ticket(5), 1 + reserved_s - 0.5)
    assert isinstance(early, Refused)
    assert decide.lapsed(state, after, at(1 + reserved_s - 0.5)) == ()
    after, later = take(state, limit, ticket(5), 1 + reserved_s)
    assert isinstance(later, Granted)
    assert decide.lapsed(state, after, at(1 + reserved_s)) == ("job-1",)  # its message is sent again
    taken, _ = take(state, limit, ticket(1), 1 + reserved_s)  # the job itself came, late: not named
    assert decide.lapsed(state, taken, at(1 + reserved_s)) == ()


def test_oldest_first_among_waiters_when_several_permits_free() -> None:
    state = PermitState()
    for n in range(4):
        state, _ = take(state, FOUR, ticket(n), 0)
    for n in range(4, 10):
        state = decide.wait(state, ticket(n), at(1), Parked(f"m{n}", "r"))
    state, woken = decide.release(state, FOUR, ticket(0), at(LEASE - 2), LEASE)
    assert [w.job for w in woken] == ["job-4"]
    state, woken = decide.release(state, FOUR, ticket(1), at(LEASE - 2), LEASE)
    assert [w.job for w in woken] == ["job-5"]
    # two dead holders' leases end: a parking waiter reserves both for the two oldest
    state = decide.live(state, FOUR, at(LEASE + 1))
    state, woken = decide.reserve(state, FOUR, at(LEASE + 1), LEASE)
    assert [w.job for w in woken] == ["job-6", "job-7"]  # job-4's and job-5's reservations still hold
    assert sorted(h.job for h in state.holders) == ["job-4", "job-5", "job-6", "job-7"]


def test_rate_limit_allows_per_second_starts_in_any_window() -> None:
    limit = Limit("http:a.example", per_second=2)
    state = PermitState()
    state, a = take(state, limit, ticket(0), 0.0)
    state, b = take(state, limit, ticket(1), 0.1)
    state, c = take(state, limit, ticket(2), 0.2)
    assert isinstance(a, Granted) and isinstance(b, Granted)
    assert isinstance(c, Refused) and c.rate and c.retry_at == at(1.0)
    assert state.holders == ()  # a rate alone holds nothing
    _, d = take(state, limit, ticket(2), 1.0)
    assert isinstance(d, Granted)
    slow = Limit("k", per_second=0.5)
    state, _ = take(PermitState(), slow, ticket(0), 0)
    _, e = take(state, slow, ticket(1), 1.9)
    assert isinstance(e, Refused) and e.retry_at == at(2.0)


def test_fallback_times_front_waiters_at_the_lease_end_others_later() -> None:
    refused_front = Refused(4, 3, at(12), ())
    refused_back = Refused(4, 4, at(12), ())
    assert decide.fallback_s(refused_front, at(0), FOUR, LEASE) == 13
    assert decide.fallback_s(refused_back, at(0), FOUR, LEASE) == int(LEASE * 4)


def test_state_round_trips_through_its_document() -> None:
    state, _ = take(PermitState(), FOUR, ticket(0), 0)
    state = decide.wait(state, ticket(1), at(1), Parked("m", "r"))
    assert PermitState.of(state.to_data(FOUR.key)) == state


@pytest.mark.parametrize(
    ("key", "n", "rate"),
    [
        ("", 1, None),
        ("Upper", 1, None),
        ("k", 0, None),
        ("k", None, None),
        ("k", None, -1.0),
        ("k", True, None),
    ],
)
def test_bad_limits_are_refused(key: str, n: int | None, rate: float | None) -> None:
    with pytest.raises(LimitError):
        Limit(key, n, rate)
