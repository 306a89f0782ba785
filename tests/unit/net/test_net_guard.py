"""The outbound guard (pure decisions, resolution) and the app's HTTP client (classification,
Retry-After, budget, pinned connections), against a real loopback receiver."""

from __future__ import annotations

import pytest

from shared.core.errors import DestinationRefused, DownstreamRejected, DownstreamUnavailable
from shared.net.client import BudgetSpent, HttpClient, deadline_at, remaining_budget, step_budget
from shared.net.guard import Guard, Refused, address_refusal, literal_address
from tests.handlerkit import Receiver, Reply


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://169.254.169.254/metadata/instance", "link-local"),
        ("https://10.1.2.3/x", "private"),
        ("https://192.168.0.7/x", "private"),
        ("https://127.0.0.1:8080/x", "loopback"),
        ("https://[::1]/x", "loopback"),
        ("https://[::ffff:169.254.169.254]/x", "link-local"),
        ("https://0.0.0.0/x", "unspecified"),
        ("https://localhost/x", "loopback name"),
        ("http://example.com/x", "http:// is allowed only"),
        ("ftp://example.com/x", "only http(s)"),
        ("https://user:pw@example.com/x", "credentials"),
        ("https://myacct.blob.core.windows.net/c/b", "own storage"),
    ],
)
def test_the_guard_refuses_what_a_handler_may_not_call(url: str, why: str) -> None:
    guard = Guard.of([], own=["myacct.blob.core.windows.net"])
    refusal = guard.url_refusal(url)
    assert refusal is not None
    assert why.split()[0] in refusal or (why == "own storage" and "own storage" in refusal)


def test_allowed_hosts_pass_and_public_addresses_pass() -> None:
    guard = Guard.of(["127.0.0.1:9", "internal.example"])
    assert guard.url_refusal("http://127.0.0.1:9/x") is None
    assert guard.url_refusal("http://internal.example/x") is None
    assert guard.url_refusal("https://93.184.215.14/x") is None
    assert guard.url_refusal("https://example.com/x") is None
    assert address_refusal(literal_address("8.8.8.8")) is None  # type: ignore[arg-type]


def test_the_resolved_address_is_checked() -> None:
    """A public-looking name that resolves to the metadata endpoint (or any private address) is
    refused before connecting; an allowed name is let through whatever it resolves to."""
    resolver = {
        "sneaky.example": ["169.254.169.254", "93.184.215.14"],
        "inside.example": ["169.254.169.254", "10.0.0.1"],
        "ok.example": ["93.184.215.14"],
    }
    guard = Guard.of([], resolver=lambda host, port: resolver[host])
    with pytest.raises(Refused, match=r"169\.254\.169\.254"):
        guard.checked_address("https://inside.example/x")
    # split horizon: only the allowed address of a mixed answer is called (issue 45, finding 8)
    assert guard.checked_address("https://sneaky.example/x") == "93.184.215.14"
    assert guard.checked_address("https://ok.example/x") == "93.184.215.14"


def test_the_connection_goes_to_the_checked_address() -> None:
    """No second resolution: a name that does not resolve at all is reached at the address the
    guard checked, and the request still names the host (Host header)."""
    receiver = Receiver()
    try:
        guard = Guard.of([f"pinned.invalid:{receiver.port}"], resolver=lambda host, port: ["127.0.0.1"])
        client = HttpClient("test", 2.0, 5.0, guard=guard)
        resp = client.request("GET", f"http://pinned.invalid:{receiver.port}/p")
        assert resp.status_code == 200
        assert receiver.requests[0].headers["Host"] == f"pinned.invalid:{receiver.port}"
    finally:
        receiver.stop()


def test_a_refused_destination_makes_no_connection() -> None:
    receiver = Receiver()
    try:
        client = HttpClient("test", 2.0, 5.0, guard=Guard.of([]))
        with pytest.raises(DestinationRefused, match="loopback"):
            client.request("POST", f"https://127.0.0.1:{receiver.port}/p")
        resolves_private = Guard.of([], resolver=lambda host, port: ["127.0.0.1"])
        with pytest.raises(DestinationRefused, match="resolves to loopback"):
            HttpClient("test", 2.0, 5.0, guard=resolves_private).request(
                "GET", f"https://x.example:{receiver.port}/"
            )
        assert receiver.requests == []
    finally:
        receiver.stop()


def test_redirects_are_not_followed_unless_allowed_and_each_target_is_checked() -> None:
    receiver = Receiver()
    try:
        guard = Guard.of([receiver.allow])
        receiver.reply(Reply(302, headers={"Location": "/next"}))
        with pytest.raises(DownstreamRejected, match="302 redirect"):
            HttpClient("test", 2.0, 5.0, guard=guard, follow_redirects=False).request(
                "GET", receiver.url("/a")
            )
        receiver.reply(Reply(302, headers={"Location": "/next"}))
        resp = HttpClient("test", 2.0, 5.0, guard=guard).request("GET", receiver.url("/a"))
        assert resp.status_code == 200 and receiver.requests[-1].path == "/next"
        receiver.reply(Reply(307, headers={"Location": "https://169.254.169.254/latest"}))
        with pytest.raises(DestinationRefused, match="link-local"):
            HttpClient("test", 2.0, 5.0, guard=guard).request("GET", receiver.url("/a"))
    finally:
        receiver.stop()


def test_answers_are_classified_and_retry_after_is_carried() -> None:
    receiver = Receiver()
    try:
        client = HttpClient("svc", 2.0, 5.0, guard=Guard.of([receiver.allow]), max_throttle_retries=0)
        receiver.reply(
            Reply(503, "busy"),
            Reply(429, headers={"Retry-After": "15"}),
            Reply(408),
            Reply(404, "no such thing Bearer abc.def.ghi"),
        )
        with pytest.raises(DownstreamUnavailable, match="HTTP 503"):
            client.request("POST", receiver.url())
        with pytest.raises(DownstreamUnavailable, match="429") as throttled:
            client.request("POST", receiver.url())
        assert throttled.value.retry_after_s == 15.0
        with pytest.raises(DownstreamUnavailable, match="HTTP 408"):
            client.request("POST", receiver.url())
        with pytest.raises(DownstreamRejected, match="HTTP 404 on POST /hook: no such thing") as rejected:
            client.request("POST", receiver.url())
        assert rejected.value.status == 404 and "abc.def" not in str(rejected.value)
    finally:
        receiver.stop()


def test_a_call_that_cannot_fit_the_deadline_is_not_made() -> None:
    receiver = Receiver()
    try:
        client = HttpClient("svc", 2.0, 30.0, guard=Guard.of([receiver.allow]))
        with step_budget(3.0), pytest.raises(BudgetSpent, match="left for the next check"):
            client.request("POST", receiver.url(), need_s=10.0)
        assert receiver.requests == []
        with step_budget(60.0), deadline_at(0.0):  # the earlier deadline wins
            left = remaining_budget()
            assert left is not None and left < 0
    finally:
        receiver.stop()
