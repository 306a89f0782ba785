"""The http kind and the app's HTTP client, re-read for security: redirects, DNS rebinding, plain
http://, addresses that carry a private one, secrets echoed back, the 4xx answer in the reason."""

from __future__ import annotations

import ipaddress
import json
import logging

import pytest

from shared.core.errors import DestinationRefused, DownstreamRejected
from shared.net.client import HttpClient
from shared.net.guard import Guard, Refused, address_refusal
from shared.net.text import origin, scrub
from tests.handlerkit import (
    JobRun,
    Receiver,
    Reply,
    allowing,
    assert_hidden,
    assert_sent,
    drain,
    kit_runtime,
    submit_job,
)

SECRET = "Zq8-partner-secret-4471"
ALLOW = {"RETRY_BASE_SECONDS": "1", "HTTP_SECRET_PARTNER": SECRET}


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("2002:a9fe:a9fe::1", "link-local"),  # 6to4 carrying 169.254.169.254
        ("2002:0a00:0001::1", "private"),  # 6to4 carrying 10.0.0.1
        ("100.100.100.200", "not globally routable"),  # shared address space (a cloud's metadata)
        ("100.64.0.1", "not globally routable"),
        ("fec0::1", "site-local"),
        ("::ffff:10.0.0.1", "private"),
    ],
)
def test_addresses_that_reach_inside_are_refused(address: str, why: str) -> None:
    refusal = address_refusal(ipaddress.ip_address(address))
    assert refusal is not None and why in refusal
    assert Guard.of([]).url_refusal(f"https://[{address}]/x" if ":" in address else f"https://{address}/x")


def test_public_addresses_pass() -> None:
    for address in ("8.8.8.8", "2606:4700::1111", "2002:0808:0808::1"):
        assert address_refusal(ipaddress.ip_address(address)) is None, address


def test_the_name_is_resolved_once_and_the_connection_goes_to_that_address(receiver: Receiver) -> None:
    """DNS rebinding: a name that answers a checked address first and another one later is reached
    at the first (the second answer, an unroutable address, would never connect)."""
    answers = [["127.0.0.1"], ["10.255.255.1"]]
    asked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers[min(len(asked), len(answers)) - 1]

    guard = Guard.of([f"rebind.test:{receiver.port}"], resolver=resolver)
    resp = HttpClient("t", 2, 5, guard=guard).request("GET", f"http://rebind.test:{receiver.port}/x")
    assert resp.status_code == 200 and asked == ["rebind.test"]
    assert receiver.requests[0].headers["Host"] == f"rebind.test:{receiver.port}"


def test_a_redirect_to_plain_http_of_an_unlisted_host_is_refused_without_a_connection(
    receiver: Receiver,
) -> None:
    receiver.reply(Reply(302, headers={"Location": "http://partner.example/next"}))
    public = {"partner.example": ["93.184.215.14"]}
    guard = Guard.of([receiver.allow], resolver=lambda host, port: public.get(host, [host]))
    with pytest.raises(DestinationRefused, match="http:// to a destination not allowed"):
        HttpClient("t", 2, 5, guard=guard).request("GET", receiver.url("/a"))
    assert len(receiver.requests) == 1


def test_redirects_loop_at_most_five_times(receiver: Receiver) -> None:
    receiver.reply(*[Reply(302, headers={"Location": "/again"})] * 10)
    with pytest.raises(DownstreamRejected, match="more than 5 redirects"):
        HttpClient("t", 2, 5, guard=Guard.of([receiver.allow])).request("GET", receiver.url("/a"))
    assert len(receiver.requests) == 6


def test_credentials_follow_a_redirect_on_the_same_origin_only(receiver: Receiver) -> None:
    other = Receiver()  # another port: another origin
    try:
        client = HttpClient("t", 2, 5, guard=Guard.of([receiver.allow, other.allow]))
        headers = {"Authorization": "Bearer a", "X-Api-Key": SECRET, "Cookie": "c=1", "X-Plain": "p"}
        receiver.reply(Reply(307, headers={"Location": "/same"}))
        client.request("POST", receiver.url("/a"), headers=headers, secret_headers=["X-Api-Key"])
        assert receiver.requests[-1].path == "/same"
        assert_sent(SECRET, [receiver.requests[-1].headers["X-Api-Key"]])
        assert receiver.requests[-1].headers["Authorization"] == "Bearer a"
        receiver.reply(Reply(307, headers={"Location": other.url("/elsewhere")}))
        client.request("POST", receiver.url("/a"), headers=headers, secret_headers=["x-api-key"])
        seen = other.requests[0].headers
        assert other.requests[0].path == "/elsewhere" and seen["X-Plain"] == "p"
        assert not {"Authorization", "X-Api-Key", "Cookie"} & set(seen)
    finally:
        other.stop()
    assert origin("https://A.example/x") == origin("https://a.example:443/y") != origin("http://a.example/x")


def test_scrub_masks_what_was_sent_makes_one_line_and_bounds_the_text() -> None:
    text = f"bad key {SECRET}\r\n\x1b[31mred\x1b[0m " + "x" * 5000 + SECRET
    out = scrub(text, secrets=[SECRET])
    assert_hidden(SECRET, out)
    assert "***" in out
    assert not any(ch in out for ch in "\r\n\x1b") and len(out) <= 403 and out.endswith("...")
    assert scrub("short\nanswer") == "short answer"


def run_http(payload: dict[str, object]) -> JobRun:
    kit = kit_runtime(**ALLOW, **allowing(str(payload["url"]), "HTTP_SECRET_PARTNER"))
    job = submit_job(kit, "http", payload)
    return JobRun(kit, job, drain(kit))


def test_a_4xx_answer_echoing_the_secret_is_kept_masked_bounded_and_on_one_line(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    receiver.reply(Reply(401, f"token {SECRET} refused\n" + "y" * 20000))
    run = run_http({"url": receiver.url(), "headers": {"X-Api-Key": {"secret": "HTTP_SECRET_PARTNER"}}})
    assert run.status == "poisoned" and "HTTP 401" in run.reason
    assert_hidden(SECRET, json.dumps(run.record), caplog.text)
    assert "token *** refused" in run.reason and "\n" not in run.reason and len(run.reason) < 700


def test_a_5xx_echoing_the_secret_is_retried_with_it_masked(receiver: Receiver) -> None:
    receiver.reply(Reply(503, f"busy, your key was {SECRET}"), Reply(200, {"ok": True}))
    run = run_http({"url": receiver.url(), "headers": {"X-Api-Key": {"secret": "HTTP_SECRET_PARTNER"}}})
    assert run.status == "completed"
    assert_hidden(SECRET, json.dumps(run.record))
    errors = [h["error"] for h in run.record["history"] if h["event"] == "retry_scheduled"]
    assert errors and "your key was ***" in errors[0]


def test_an_answer_echoing_the_secret_is_kept_masked_in_the_result(receiver: Receiver) -> None:
    receiver.reply(Reply(200, {"echo": SECRET}, headers={"X-Request-Id": SECRET}))
    run = run_http({"url": receiver.url(), "headers": {"X-Api-Key": {"secret": "HTTP_SECRET_PARTNER"}}})
    result = run.result()
    assert result["body"] == {"echo": "***"} and result["headers"]["x-request-id"] == "***"
    assert_sent(SECRET, [receiver.requests[0].headers["X-Api-Key"]])


@pytest.mark.parametrize("host", ["2130706433", "0x7f.0.0.1", "127.1", "017700000001"])
def test_other_spellings_of_loopback_are_refused_at_post_and_before_connecting(host: str) -> None:
    """Not literal addresses to `ipaddress`, but the system resolver reads them as 127.0.0.1: the
    guard decodes them the same way, so POST refuses them (400) and so does the call."""
    guard = Guard.of([])
    assert "loopback address 127.0.0.1" in (guard.url_refusal(f"https://{host}/x") or "")
    with pytest.raises(Refused, match="loopback"):
        guard.checked_address(f"https://{host}/x")


def test_a_loopback_name_with_a_trailing_dot_is_refused_at_post() -> None:
    for url in ("https://localhost./x", "https://api.localhost./x"):
        assert "loopback name" in (Guard.of([]).url_refusal(url) or "")
