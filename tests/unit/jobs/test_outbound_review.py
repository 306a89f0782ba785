"""Issue 45's review of the outbound guard and the `http` kind, one test (or a few) per finding,
on the handler kit with local TLS stand-ins (a CA made here), a scripted resolver and a raw
downstream. No secret value is printed: assertions compare without showing it."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.core.errors import EnvelopeError, SettingsError
from shared.jobs.http import HttpHandler
from shared.net.destinations import literal_address
from shared.net.guard import Guard, address_refusal
from tests.handlerkit import JobRun, Kit, Reply, drain, kit_runtime, submit_job
from tests.netkit import RawDownstream, ScriptedResolver, TestCA, TlsReceiver

SECRET = "pArt/ner+Key-7Qx2w9Lm"
"""The partner's secret: a `/` (JSON's `\\/`), a `+` (URL-encoding's space) in it."""


def leaks(text: str, secret: str = SECRET, window: int = 5) -> bool:
    """Whether `text` holds any `window` consecutive characters of `secret` (never printed)."""
    return any(secret[i : i + window] in text for i in range(len(secret) - window + 1))


def check_clean(*texts: str) -> None:
    dirty = [i for i, text in enumerate(texts) if leaks(text)]
    assert not dirty, f"texts {dirty} hold part of the secret (not shown)"


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path)


@pytest.fixture
def partner(ca: TestCA) -> Iterator[TlsReceiver]:
    server = TlsReceiver(
        ca, ["partner.test", "attacker.test", "split.test", "xn--bcher-kva.test", "127.0.0.1"]
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def other(ca: TestCA) -> Iterator[TlsReceiver]:
    server = TlsReceiver(ca, ["partner.test", "attacker.test", "127.0.0.1"])
    try:
        yield server
    finally:
        server.stop()


def http_kit(ca: TestCA, resolver: ScriptedResolver, **settings: str) -> Kit:
    handler = HttpHandler(resolver=resolver, verify=ca.bundle)
    return kit_runtime({"http": handler}, RETRY_BASE_SECONDS="1", HTTP_MAX_ATTEMPTS="2", **settings)


def run(kit: Kit, payload: dict[str, Any]) -> JobRun:
    job = submit_job(kit, "http", payload)
    return JobRun(kit, job, drain(kit))


def stored(run: JobRun) -> str:
    """Everything the run stored: every blob of the account (ledger, archive, results) and the indexes."""
    parts = [json.dumps(run.record)]
    for container in run.kit.account.containers.values():
        parts += [blob.data.decode("latin-1") for blob in container.blobs.values()]
    return "\n".join(parts)


PARTNER_HEADER = {"X-Api-Key": {"secret": "HTTP_SECRET_PARTNER"}}


def partner_settings(partner: TlsReceiver, *more: str) -> dict[str, str]:
    hosts = ",".join([f"partner.test:{partner.port}", f"attacker.test:{partner.port}", *more])
    return {
        "HTTP_ALLOWED_HOSTS": hosts,
        "HTTP_SECRET_PARTNER": SECRET,
        "HTTP_SECRET_PARTNER_HOSTS": f"partner.test:{partner.port}",
    }


RESOLVER = {"partner.test": ["127.0.0.1"], "attacker.test": ["127.0.0.1"]}


# -- 1. a secret goes only to its destinations ------------------------------------------------


def test_1_a_secret_is_refused_at_post_for_any_other_destination(ca: TestCA, partner: TlsReceiver) -> None:
    kit = http_kit(ca, ScriptedResolver(RESOLVER), **partner_settings(partner))
    with pytest.raises(EnvelopeError) as refused:
        submit_job(kit, "http", {"url": f"https://attacker.test:{partner.port}/c", "headers": PARTNER_HEADER})
    assert "HTTP_SECRET_PARTNER" in str(refused.value) and f"attacker.test:{partner.port}" in str(
        refused.value
    )
    job = run(kit, {"url": f"https://partner.test:{partner.port}/c", "headers": PARTNER_HEADER})
    assert job.status == "completed"
    assert [r.headers["X-Api-Key"] == SECRET for r in partner.requests] == [True]
    assert [r.headers["Host"] for r in partner.requests] == [f"partner.test:{partner.port}"]


def test_1_a_secret_without_destinations_refuses_to_start_naming_it() -> None:
    with pytest.raises(SettingsError, match="HTTP_SECRET_PARTNER has no destinations") as refused:
        kit_runtime(HTTP_SECRET_PARTNER=SECRET)
    check_clean(str(refused.value))


def test_1_a_redirect_elsewhere_is_refused_at_call_time(
    ca: TestCA, partner: TlsReceiver, other: TlsReceiver
) -> None:
    """The partner answers 307 to the attacker (allowed by HTTP_ALLOWED_HOSTS, not by the secret's
    destinations): the redirect is not followed, the attacker gets no request."""
    settings = partner_settings(partner, f"attacker.test:{other.port}")
    kit = http_kit(ca, ScriptedResolver(RESOLVER), HTTP_FOLLOW_REDIRECTS="true", **settings)
    partner.reply(Reply(307, headers={"Location": f"https://attacker.test:{other.port}/steal"}))
    job = run(kit, {"url": f"https://partner.test:{partner.port}/c", "headers": PARTNER_HEADER})
    assert job.status == "poisoned" and job.record["reason_code"] == "destination_refused"
    assert "HTTP_SECRET_PARTNER" in job.reason
    assert other.requests == []


def test_1_ctx_secret_goes_only_to_its_destinations(ca: TestCA, partner: TlsReceiver) -> None:
    """A kind's own secret (`ctx.secret`) is held to `<PREFIX>SECRET_<NAME>_HOSTS` by the client."""
    from shared.core.errors import PayloadError
    from shared.jobs.base import Completed, JobContext
    from shared.net.client import HttpClient

    class Signer:
        settings_prefix = "SIGN_"

        def validate(self, payload: Any) -> None:
            if not isinstance(payload.get("url"), str):
                raise PayloadError(["payload.url: required"])

        def run(self, ctx: JobContext) -> Completed:
            guard = Guard.of(
                [f"partner.test:{partner.port}", f"attacker.test:{partner.port}"], resolver=resolver
            )
            client = HttpClient("sign", 2, 5, guard=guard, verify=ca.bundle)
            client.request("POST", ctx.payload["url"], headers={"X-Key": ctx.secret("KEY")})
            return Completed("")

    resolver = ScriptedResolver(RESOLVER)
    kit = kit_runtime(
        {"sign": Signer()}, SIGN_SECRET_KEY=SECRET, SIGN_SECRET_KEY_HOSTS=f"partner.test:{partner.port}"
    )
    job = JobRun(kit, submit_job(kit, "sign", {"url": f"https://attacker.test:{partner.port}/x"}))
    job.waits = drain(kit)
    assert job.status == "poisoned" and job.record["reason_code"] == "destination_refused"
    assert "SIGN_SECRET_KEY" in job.reason and partner.requests == []
    check_clean(stored(job))


# -- 2. escaped echoes are masked ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (json.dumps({"echo": SECRET}).replace("/", "\\/").encode(), "application/json"),
        (json.dumps({"echo": "".join(f"\\u{ord(c):04x}" for c in SECRET)}).encode(), "application/json"),
        (json.dumps({"echo": SECRET}).encode("utf-16"), "application/json"),
        (json.dumps({"echo": SECRET}).encode("utf-16-le"), "application/json"),
    ],
    ids=["json-slash-escapes", "json-u-escapes", "utf16-bom", "utf16-le"],
)
def test_2_escaped_echoes_of_the_secret_are_masked_in_the_result(
    ca: TestCA, partner: TlsReceiver, body: bytes, content_type: str
) -> None:
    kit = http_kit(ca, ScriptedResolver(RESOLVER), **partner_settings(partner))
    partner.reply(Reply(200, body, {"Content-Type": content_type}))
    job = run(kit, {"url": f"https://partner.test:{partner.port}/c", "headers": PARTNER_HEADER})
    assert job.status == "completed"
    assert job.result()["body"] == {"echo": "***"}
    check_clean(stored(job), json.dumps(job.result(), ensure_ascii=False))


# -- 3. masking before cutting ------------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 503])
def test_3_control_padding_does_not_pull_the_secret_into_the_reason(
    ca: TestCA, partner: TlsReceiver, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    kit = http_kit(ca, ScriptedResolver(RESOLVER), **partner_settings(partner))
    partner.reply(*[Reply(status, "\x01" * 1601 + SECRET)] * 2)
    job = run(kit, {"url": f"https://partner.test:{partner.port}/c", "headers": PARTNER_HEADER})
    assert job.status == "poisoned" and f"HTTP {status}" in job.reason
    check_clean(stored(job), caplog.text)


@pytest.mark.parametrize("offset", [1, 2, 5, len(SECRET) - 1])
def test_3_a_body_cut_across_the_secret_keeps_none_of_it(
    ca: TestCA, partner: TlsReceiver, offset: int
) -> None:
    kit = http_kit(ca, ScriptedResolver(RESOLVER), HTTP_MAX_BODY_BYTES="1024", **partner_settings(partner))
    partner.reply(Reply(200, "a" * (1024 - offset) + SECRET + "b" * 100, {"Content-Type": "text/plain"}))
    job = run(kit, {"url": f"https://partner.test:{partner.port}/c", "headers": PARTNER_HEADER})
    assert job.status == "completed" and job.result()["body_truncated"] is True
    check_clean(stored(job))
    assert not any(SECRET[:n] in job.result()["body"][-n:] for n in range(3, len(SECRET)))


# -- 4. redirect targets never reach messages -------------------------------------------------


@pytest.mark.parametrize(
    "location",
    [
        f"https://u:{SECRET}@elsewhere.test/",
        f"https://{SECRET.replace('/', '').replace('+', '')}.elsewhere.test/",
        f"https://elsewhere.test:{SECRET}/",
        "https://elsewhere.test:99999/",
        f"https://attacker.test:1/{SECRET}",
    ],
    ids=["userinfo", "host", "port", "bad-port", "path"],
)
def test_4_a_location_echoing_the_secret_stays_out_of_reason_history_and_logs(
    ca: TestCA, partner: TlsReceiver, location: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    kit = http_kit(ca, ScriptedResolver(RESOLVER), HTTP_FOLLOW_REDIRECTS="true", **partner_settings(partner))
    partner.reply(Reply(302, headers={"Location": location}))
    job = run(kit, {"url": f"https://partner.test:{partner.port}/c", "headers": PARTNER_HEADER})
    assert job.status == "poisoned" and "GET /c" not in job.reason
    assert "/c" in job.reason  # the request as sent
    check_clean(stored(job), caplog.text)
    assert "ValueError" not in caplog.text and "Traceback" not in caplog.text


def test_4_urllib3_debug_logs_stay_out_of_the_apps_logs(
    ca: TestCA, partner: TlsReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    kit = http_kit(ca, ScriptedResolver(RESOLVER), **partner_settings(partner))
    job = run(kit, {"url": f"https://partner.test:{partner.port}/p/q?token=abc", "headers": PARTNER_HEADER})
    assert job.status == "completed"
    assert not [r for r in caplog.records if r.name.startswith("urllib3") and r.levelno < logging.WARNING]
    assert "token=abc" not in caplog.text


# -- 5. the app's own storage endpoints -------------------------------------------------------

OWN = "DefaultEndpointsProtocol=https;AccountName=myacct;AccountKey=a2V5;EndpointSuffix=core.windows.net"


@pytest.mark.parametrize(
    "host",
    [
        "myacct.blob.core.windows.net.",
        "MyAcct.Blob.Core.Windows.Net",
        "myacct-secondary.blob.core.windows.net",
        "myacct.privatelink.blob.core.windows.net",
        "myacct.dfs.core.windows.net",
        "myacct-secondary.queue.core.windows.net.",
        "myacct.table.core.windows.net",
        "myacct.file.core.windows.net",
    ],
)
def test_5_the_apps_own_endpoints_are_refused_at_post_by_name(ca: TestCA, host: str) -> None:
    kit = http_kit(ca, ScriptedResolver({}), AzureWebJobsStorage=OWN)
    with pytest.raises(EnvelopeError, match="own storage"):
        submit_job(kit, "http", {"url": f"https://{host}/c/b"})


def test_5_a_name_resolving_to_the_apps_storage_address_is_refused(ca: TestCA) -> None:
    resolver = ScriptedResolver(
        {"myacct.blob.core.windows.net": ["20.60.1.1"], "innocent.test": ["20.60.1.1"]}
    )
    kit = http_kit(ca, resolver, AzureWebJobsStorage=OWN)
    job = run(kit, {"url": "https://innocent.test/c/b"})
    assert job.status == "poisoned" and job.record["reason_code"] == "destination_refused"
    assert "own storage" in job.reason


def test_5_another_kinds_guard_refuses_the_apps_storage_too() -> None:
    kit_runtime(AzureWebJobsStorage=OWN)  # start-up registers the app's endpoints
    refusal = Guard.of([], setting="WEBHOOK_ALLOWED_HOSTS").url_refusal(
        "https://myacct-secondary.blob.core.windows.net/"
    )
    assert refusal is not None and "own storage" in refusal


# -- 6. ports --------------------------------------------------------------------------------


def test_6_an_allowed_port_opens_that_port_only(ca: TestCA, partner: TlsReceiver, other: TlsReceiver) -> None:
    kit = http_kit(ca, ScriptedResolver({}), HTTP_ALLOWED_HOSTS=f"127.0.0.1:{partner.port}")
    with pytest.raises(EnvelopeError, match="loopback"):
        submit_job(kit, "http", {"url": f"https://127.0.0.1:{other.port}/x"})
    assert run(kit, {"url": f"https://127.0.0.1:{partner.port}/x"}).status == "completed"
    guard = Guard.of(["partner.example:8443", "plain.example"])
    assert guard.url_refusal("http://partner.example:8443/") is None
    assert guard.url_refusal("http://plain.example/") is None
    assert guard.url_refusal("http://plain.example:8080/") is not None
    assert guard.url_refusal("http://partner.example/") is not None


def test_6_a_redirect_to_another_port_is_a_new_destination(
    ca: TestCA, partner: TlsReceiver, other: TlsReceiver
) -> None:
    kit = http_kit(
        ca, ScriptedResolver({}), HTTP_ALLOWED_HOSTS=f"127.0.0.1:{partner.port}", HTTP_FOLLOW_REDIRECTS="true"
    )
    partner.reply(Reply(302, headers={"Location": f"https://127.0.0.1:{other.port}/x"}))
    job = run(kit, {"url": f"https://127.0.0.1:{partner.port}/x"})
    assert job.status == "poisoned" and job.record["reason_code"] == "destination_refused"
    assert other.requests == []


# -- 7. everything a payload carries is checked at POST ----------------------------------------


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"url": "https://public.test:99999/"}, "payload.url"),
        ({"url": "https://public.test:abc/"}, "payload.url"),
        ({"url": "https://public.test:0/"}, "payload.url"),
        ({"url": "https://[::1/"}, "payload.url"),
        ({"url": "https://2130706433/"}, "payload.url"),
        ({"url": "https://0x7f000001/"}, "payload.url"),
        ({"url": "https://127.1/"}, "payload.url"),
        ({"url": "https://0/"}, "payload.url"),
        ({"url": "https://192.0.0.8/"}, "payload.url"),
        ({"url": "https://168.63.129.16/"}, "payload.url"),
        ({"url": "https://public.test/", "headers": {"X-A": "price \u20ac"}}, "payload.headers.X-A"),
        ({"url": "https://public.test/", "headers": {"X-A": "a\u2028b"}}, "payload.headers.X-A"),
        ({"url": "https://public.test/", "headers": {"X A": "b"}}, "payload.headers"),
        ({"url": "https://public.test/", "method": "TRACE"}, "payload.method"),
    ],
)
def test_7_bad_input_is_a_400_naming_the_field(ca: TestCA, payload: dict[str, Any], field: str) -> None:
    kit = http_kit(ca, ScriptedResolver({"public.test": ["93.184.215.14"]}))
    with pytest.raises(EnvelopeError, match=field.replace(".", r"\.")):
        submit_job(kit, "http", payload)


# -- 8. no false refusals ---------------------------------------------------------------------


def test_8_nat64_and_mapped_public_addresses_pass_and_192_0_0_9_is_global() -> None:
    for text in ("64:ff9b::808:808", "::ffff:8.8.8.8", "192.0.0.9", "192.0.0.10"):
        address = literal_address(text)
        assert address is not None and address_refusal(address) is None, text
    for text in ("64:ff9b::a00:1", "::ffff:10.0.0.1", "64:ff9b::a9fe:a9fe"):
        address = literal_address(text)
        assert address is not None and address_refusal(address) is not None, text
    assert Guard.of([]).url_refusal("https://[64:ff9b::808:808]/") is None


def test_8_a_split_horizon_name_calls_only_its_allowed_address(ca: TestCA, partner: TlsReceiver) -> None:
    resolver = ScriptedResolver({"split.test": ["10.1.2.3", "127.0.0.1"]})
    kit = http_kit(ca, resolver, HTTP_ALLOWED_HOSTS=f"127.0.0.1:{partner.port}")
    job = run(kit, {"url": f"https://split.test:{partner.port}/x"})
    assert job.status == "completed" and len(partner.requests) == 1


def test_8_ipv6_and_idna_spellings_of_an_allowed_host_match(ca: TestCA, partner: TlsReceiver) -> None:
    guard = Guard.of(["::1", "bücher.test"])
    assert guard.url_refusal("https://[0:0:0:0:0:0:0:1]/x") is None
    assert guard.url_refusal("https://xn--bcher-kva.test/x") is None
    assert Guard.of(["xn--bcher-kva.test"]).url_refusal("http://BÜCHER.test/x") is None
    kit = http_kit(
        ca,
        ScriptedResolver({"xn--bcher-kva.test": ["127.0.0.1"]}),
        HTTP_ALLOWED_HOSTS=f"bücher.test:{partner.port}",
    )
    assert run(kit, {"url": f"https://xn--bcher-kva.test:{partner.port}/x"}).status == "completed"


def test_raw_downstream_a_header_that_names_the_secret_as_a_port_does_not_crash(ca: TestCA) -> None:
    """A raw answer whose Location port is the secret: poisoned with a clean reason, no crash."""
    raw = RawDownstream(
        f"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{SECRET}/\r\nContent-Length: 0\r\n\r\n".encode()
    )
    try:
        kit = http_kit(
            ca,
            ScriptedResolver({}),
            HTTP_ALLOWED_HOSTS=raw.allow,
            HTTP_FOLLOW_REDIRECTS="true",
            HTTP_SECRET_PARTNER=SECRET,
            HTTP_SECRET_PARTNER_HOSTS=raw.allow,
        )
        job = run(kit, {"url": raw.url("/c"), "headers": PARTNER_HEADER})
        assert job.status == "poisoned" and job.record["reason_code"] == "downstream_rejected"
        assert len(raw.requests) == 1
        check_clean(stored(job))
    finally:
        raw.stop()


def test_5_a_queues_own_connection_is_the_apps_storage_too(ca: TestCA) -> None:
    other = (
        "DefaultEndpointsProtocol=https;AccountName=queueacct;AccountKey=a2V5;EndpointSuffix=core.windows.net"
    )
    kit = http_kit(
        ca,
        ScriptedResolver({}),
        JOBS_QUEUES="jobs,other",
        QUEUE_OTHER_CONNECTION="OTHERSTORE",
        OTHERSTORE=other,
    )
    with pytest.raises(EnvelopeError, match="own storage"):
        submit_job(kit, "http", {"url": "https://QueueAcct-secondary.queue.core.windows.net./q"})


def test_2_a_kinds_secret_is_masked_in_all_a_run_stores_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    """`ctx.secret`: whatever the handler puts it in (progress, an effect, a continuation's state,
    the summary, a log line, the error that ends a run) is stored and logged masked."""
    from shared.core.errors import DownstreamUnavailable
    from shared.jobs.base import Completed, Continue, JobContext, Outcome

    class Careless:
        def validate(self, payload: Any) -> None:
            return None

        def run(self, ctx: JobContext) -> Outcome:
            key = ctx.secret("KEY")
            ctx.log.warning("using %s", key)
            if ctx.resume_state is None:
                ctx.checkpoint({"seen": key})
                ctx.effect("echo", lambda: {"key": key})
                return Continue({"key": key, "b64": key.encode().hex()}, delay_s=5)
            if ctx.attempt == 0:
                raise DownstreamUnavailable(f"the key {key} did not work")
            return Completed("", {"key": key})

    caplog.set_level(logging.DEBUG)
    kit = kit_runtime(
        {"careless": Careless()}, CARELESS_SECRET_KEY=SECRET, CARELESS_SECRET_KEY_HOSTS="x.test"
    )
    job = JobRun(kit, submit_job(kit, "careless", {}))
    job.waits = drain(kit)
    assert job.status == "completed" and job.record["summary"] == {"key": "***"}
    check_clean(stored(job), caplog.text)
