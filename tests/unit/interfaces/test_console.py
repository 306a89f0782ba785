"""The console's pure decisions: who may use it, CSRF, rate plans, paging, counters, edits."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from shared import ledger
from shared.core.documents import Conflict
from shared.core.envelope import Envelope
from shared.core.errors import SettingsError
from shared.indexes.counters import TableCounters
from shared.interfaces.console import queries
from shared.interfaces.console.actions import ActionRefused, check_edit, describe_changes, tick_size
from shared.interfaces.console.assets import CSP, CSS, JS
from shared.interfaces.console.charts import svg_lines
from shared.interfaces.console.pages import job_page, layout, overview_fragment, poison_page
from shared.interfaces.console.queries import JobView, PoisonView
from shared.interfaces.console.security import (
    CSRF_TTL_S,
    Denied,
    authorize,
    check_csrf,
    check_origin,
    cookie_token,
    csrf_secret,
    decode_principal,
    issue_token,
    keyed_refusal,
    public_origins,
    set_cookie,
    token_refusal,
)
from shared.jobs import noop, testing
from shared.ledger import Facts
from shared.ledger import operator as ledger_operator
from shared.ledger import view as ledger_view
from shared.observability import overview_counters
from shared.poison import pacing
from shared.storage.memory_documents import MemoryDocuments
from shared.storage.memory_tables import MemoryTables

NOW = datetime(2026, 11, 24, 12, 30, 15, tzinfo=UTC)
AZURE = {
    "WEBSITE_INSTANCE_ID": "abc",
    "WEBSITE_AUTH_ENABLED": "True",
    "CONSOLE_ALLOWED_ROLES": "Console.Operator",
}


def principal(*claims: tuple[str, str]) -> str:
    doc = {
        "auth_typ": "aad",
        "name_typ": "name",
        "role_typ": "roles",
        "claims": [{"typ": t, "val": v} for t, v in claims],
    }
    return base64.b64encode(json.dumps(doc).encode()).decode()


# -- who may use it -------------------------------------------------------------------------


def test_local_host_is_open_like_the_rest_of_the_local_api() -> None:
    assert authorize({"host": "127.0.0.1:7071"}, {}).name == "local"
    assert authorize({"host": "localhost"}, {}).name == "local"
    with pytest.raises(Denied):  # not addressed to the loopback interface: not the local host
        authorize({"host": "jobs.example.net"}, {})
    with pytest.raises(Denied):  # on the platform, even through a loopback address
        authorize({"host": "127.0.0.1:8080"}, {"WEBSITE_SITE_NAME": "jobs-func"})


def test_in_azure_an_operator_needs_an_allowed_role_or_group() -> None:
    ok = authorize(
        {"x-ms-client-principal": principal(("name", "ann@x"), ("roles", "Console.Operator"))}, AZURE
    )
    assert ok.name == "ann@x" and ok.how == "aad"
    env = {**AZURE, "CONSOLE_ALLOWED_ROLES": "", "CONSOLE_ALLOWED_GROUPS": "g-1, g-2"}
    assert (
        authorize({"x-ms-client-principal": principal(("name", "bo"), ("groups", "g-2"))}, env).name == "bo"
    )
    with pytest.raises(Denied) as denied:
        authorize({"x-ms-client-principal": principal(("name", "cy"), ("roles", "Reader"))}, AZURE)
    assert denied.value.status == 403 and "cy has none" in str(denied.value)


@pytest.mark.parametrize(
    ("headers", "env", "status", "words"),
    [
        ({}, AZURE, 401, "sign in"),
        ({"x-ms-client-principal": "not base64!"}, AZURE, 401, "could not be read"),
        (
            {"x-ms-client-principal": principal(("roles", "Console.Operator"))},
            {**AZURE, "WEBSITE_AUTH_ENABLED": ""},
            403,
            "App Service Authentication",
        ),
        (
            {"x-ms-client-principal": principal(("roles", "Console.Operator"))},
            {**AZURE, "CONSOLE_ALLOWED_ROLES": ""},
            403,
            "CONSOLE_ALLOWED_ROLES",
        ),
    ],
)
def test_in_azure_refusals_say_what_is_missing(
    headers: dict[str, str], env: dict[str, str], status: int, words: str
) -> None:
    """Without Easy Auth on, a principal header could be forged: it is not trusted at all."""
    with pytest.raises(Denied) as denied:
        authorize(headers, env)
    assert denied.value.status == status and words in str(denied.value)


# -- CSRF -----------------------------------------------------------------------------------

SECRET = b"k" * 32
T0 = 1_790_000_000.0
URL = "http://127.0.0.1:7071/api/console/action/replay"
TOKEN = issue_token("local:local", SECRET, T0)


def csrf(
    headers: dict[str, str], subject: str = "local:local", now: float = T0 + 60, **kw: Any
) -> str | None:
    return check_csrf("POST", headers, URL, subject=subject, secret=SECRET, now=now, **kw)


def pair(token: str) -> dict[str, str]:
    return {"cookie": f"console_csrf={token}", "x-console-csrf": token, "host": "127.0.0.1:7071"}


def test_a_change_needs_the_cookie_token_echoed_in_a_header_from_the_same_origin() -> None:
    good = pair(TOKEN)
    assert csrf(good) is None
    assert csrf({**good, "origin": "http://127.0.0.1:7071", "sec-fetch-site": "same-origin"}) is None
    assert "CSRF" in str(csrf({**good, "x-console-csrf": ""}))
    assert "CSRF" in str(csrf({**good, "x-console-csrf": issue_token("local:local", SECRET, T0 + 1)}))
    assert "CSRF" in str(csrf({"x-console-csrf": TOKEN}))
    assert "another origin" in str(csrf({**good, "origin": "http://evil.example"}))
    assert "cross-site" in str(csrf({**good, "sec-fetch-site": "cross-site"}))
    assert "POST" in str(check_csrf("GET", good, URL, subject="local:local", secret=SECRET, now=T0))


def test_an_equal_cookie_and_header_pair_is_not_enough_the_token_must_be_ours() -> None:
    """Before: any equal pair of 20+ characters passed."""
    assert "CSRF" in str(csrf(pair("A" * 43)))
    assert "CSRF" in str(csrf(pair("1790000000." + "A" * 43)))
    assert "not issued" in str(csrf(pair(issue_token("local:local", b"o" * 32, T0))))  # another key


def test_a_token_is_bound_to_its_principal_and_expires() -> None:
    ann = issue_token("aad:oid-ann", SECRET, T0)
    assert csrf(pair(ann), subject="aad:oid-ann") is None
    assert "not issued" in str(csrf(pair(ann), subject="aad:oid-bo"))
    assert csrf(pair(ann), subject="aad:oid-ann", now=T0 + CSRF_TTL_S) is None
    assert "expired" in str(csrf(pair(ann), subject="aad:oid-ann", now=T0 + CSRF_TTL_S + 1))
    assert "expired" in str(token_refusal(issue_token("s", SECRET, T0 + 3600), "s", SECRET, T0))
    assert token_refusal("nope", "s", SECRET, T0) == "malformed CSRF token"


def test_the_token_binds_the_entra_object_id_not_the_display_name() -> None:
    ann = decode_principal(
        principal(("name", "Ann"), ("http://schemas.microsoft.com/identity/claims/objectidentifier", "o-1"))
    )
    assert ann.subject == "aad:o-1"
    assert decode_principal(principal(("name", "Ann"))).subject == "aad:Ann"


def test_the_secret_comes_from_the_setting_is_required_in_azure_and_never_shown() -> None:
    assert csrf_secret({"CONSOLE_CSRF_SECRET": "s" * 40}) == b"s" * 40
    local = csrf_secret({})
    assert len(local) == 32 and csrf_secret({}) == local, "locally: one random key per process"
    with pytest.raises(SettingsError, match="CONSOLE_CSRF_SECRET is not set"):
        csrf_secret({"WEBSITE_INSTANCE_ID": "abc"})
    with pytest.raises(SettingsError) as short:
        csrf_secret({"CONSOLE_CSRF_SECRET": "tooshort-secret"})
    assert "tooshort" not in str(short.value)


def test_origin_null_and_forwarded_hosts_are_refused() -> None:
    good = pair(TOKEN)
    assert "Origin: null" in str(csrf({**good, "origin": "null"}))
    assert "Origin: null" in str(check_origin({"origin": "null", "host": "127.0.0.1:7071"}, URL))
    forged = {**good, "origin": "http://evil.example", "x-forwarded-host": "evil.example"}
    assert "another origin" in str(csrf(forged)), "X-Forwarded-Host is whatever a client sent"
    azure = {"host": "jobs.azurewebsites.net", "origin": "https://jobs.azurewebsites.net"}
    assert check_origin(azure, "http://jobs.azurewebsites.net/api/console/action/x") is None
    proxied = {"host": "jobs.azurewebsites.net", "origin": "https://ops.example.com"}
    assert "another origin" in str(check_origin(proxied, URL))
    origins = public_origins({"CONSOLE_PUBLIC_ORIGINS": "https://OPS.example.com/, http://x"})
    assert origins == ("https://ops.example.com", "http://x")
    assert check_origin(proxied, URL, origins) is None


def test_the_cookie_is_strict_same_site_and_hidden_from_scripts() -> None:
    cookie = set_cookie(TOKEN, secure=True)
    assert "SameSite=Strict" in cookie and "HttpOnly" in cookie and "Secure" in cookie
    assert "Secure" not in set_cookie(TOKEN, secure=False)
    assert cookie_token({"cookie": f"a=b; console_csrf={TOKEN}"}) == TOKEN
    assert cookie_token({"cookie": "console_csrf=short"}) is None


def test_the_local_admin_key_route_answers_loopback_hosts_only() -> None:
    """Locally the host checks no key: a rebound name (evil.example -> 127.0.0.1) must not reach it."""
    assert keyed_refusal({"host": "127.0.0.1:7071"}, {}) is None
    assert "127.0.0.1" in str(keyed_refusal({"host": "evil.example:7071"}, {}))
    assert keyed_refusal({"host": "jobs.azurewebsites.net"}, {"WEBSITE_INSTANCE_ID": "i"}) is None


def test_the_policy_allows_the_inlined_script_and_style_and_nothing_else() -> None:
    html = layout("t", "<p>x</p>", "/api/console", TOKEN, "me")
    script = html[html.index("<script>") + 8 : html.index("</script>")]
    style = html[html.index("<style>") + 7 : html.index("</style>")]
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert directives["default-src"] == "'none'"
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert directives["script-src"] == f"'sha256-{digest}'"
    assert "unsafe" not in CSP and style == CSS
    pages_html = poison_page(PoisonView([], [], [], NOW), "/b") + job_page(
        JobView({"status": "poisoned"}, [], None, "{}", {}, "", []), "/b", "j"
    )
    assert not re.search(r"<[^>]*\s(on[a-z]+|style)=", pages_html), "no inline handlers or styles"


# -- replay at a rate -----------------------------------------------------------------------


def test_a_replay_request_carries_one_ticks_worth_of_ids_as_the_page_sends_them() -> None:
    assert tick_size(25) == 12, "half a second at 25/s"
    assert tick_size(0.5) == 1, "at least one a request"
    assert tick_size(1000) == 50, "at most 50 a request"
    assert f"TICK_S = {pacing.TICK_S}, MAX_BATCH = {pacing.TICK_ITEMS};" in JS, "the page sends the same"
    with pytest.raises(ActionRefused):
        tick_size(0)


# -- jobs list ------------------------------------------------------------------------------


def test_ledger_writes_carry_the_listing_metadata() -> None:
    data = {"status": "queued", "kind": "noop", "created_at": "t1", "updated_at": "t2", "attempt": 0}
    assert ledger_view.listing_metadata(data) == {
        "status": "queued",
        "kind": "noop",
        "created_at": "t1",
        "updated_at": "t2",
    }


# -- overview counters ----------------------------------------------------------------------


def test_counters_cost_no_storage_request_per_message_and_flush_once_per_changed_hour() -> None:
    clock = [NOW]
    recorder = overview_counters.Recorder(clock=lambda: clock[0])
    ops: list[str] = []

    def note(op: str, name: str) -> None:
        ops.append(op)

    tables = MemoryTables(lambda: clock[0])
    counters = TableCounters(tables, "metrics", MemoryDocuments(lambda: clock[0], before=note))
    counters.ensure()  # start-up
    ops.extend(tables.requests)
    for i in range(1000):
        recorder.on_decision("completed", {"latency_s": 0.2 if i % 10 else 40})
    recorder.on_decision("retry_scheduled", {})
    recorder.on_decision("poisoned", {})
    recorder.on_decision("claimed", {})
    assert ops == tables.requests == ["POST /devstoreaccount1/Tables"], "no request per message"
    assert recorder.flush(counters, "host:1") == 1
    assert tables.requests[1:] == [
        "PUT /devstoreaccount1/metrics(PartitionKey='2026-11-24T12',RowKey='host_1')"
    ]
    assert recorder.flush(counters, "host:1") == 0 and len(tables.requests) == 2
    docs = counters.read(["2026-11-24T12"], None)
    assert len(docs) == 1
    minute = docs[0]["minutes"]["2026-11-24T12:30"]
    assert (minute["completed"], minute["retried"], minute["poisoned"]) == (1000, 1, 1)
    figures = overview_counters.merge([docs[0]], NOW + timedelta(seconds=30))
    assert figures["series"]["completed"][-1] == 1000 and figures["latency_p50_s"] == 0.25
    assert figures["latency_p95_s"] == 60.0


def test_merge_sums_instances_and_counts_in_flight_from_the_latest_recent_document() -> None:
    def doc(instance: str, written: datetime, in_flight: int, minute: str, completed: int) -> dict[str, Any]:
        return {
            "instance": instance,
            "written_at": written.isoformat(),
            "in_flight": in_flight,
            "minutes": {
                minute: {"completed": completed, "retried": 0, "poisoned": 0, "latency": [completed]}
            },
        }

    docs: list[Mapping[str, Any]] = [
        doc("a", NOW - timedelta(seconds=30), 3, "2026-11-24T12:29", 5),
        doc("a", NOW - timedelta(minutes=50), 9, "2026-11-24T11:45", 2),  # previous hour, old in-flight
        doc("b", NOW - timedelta(minutes=10), 4, "2026-11-24T12:20", 1),  # gone quiet: in flight unknown
        doc("c", NOW, 1, "2026-11-24T10:00", 7),  # outside the hour
    ]
    figures = overview_counters.merge(docs, NOW)
    assert sum(figures["series"]["completed"]) == 8 and figures["in_flight"] == 4
    assert figures["latency_hist"][0] == 8
    assert overview_counters.hours_to_read(NOW) == ["2026-11-24T11", "2026-11-24T12"]


def test_damaged_counter_documents_count_nothing_and_never_fail_the_overview() -> None:
    """Documents of the wrong shape (another version's, or damaged) next to a good one: the
    figures are the good one's, and reading them from the counters table skips what is not JSON."""
    good: dict[str, Any] = {
        "instance": "a",
        "written_at": (NOW - timedelta(seconds=30)).isoformat(),
        "in_flight": 2,
        "minutes": {"2026-11-24T12:29": {"completed": 3, "retried": 1, "poisoned": 0, "latency": [3]}},
    }
    damaged: list[Mapping[str, Any]] = [
        {"minutes": ["2026-11-24T12:29"]},
        {"minutes": "x", "in_flight": "many", "written_at": NOW.isoformat(), "instance": "b"},
        {"minutes": {"2026-11-24T12:29": {"completed": "3", "retried": None, "latency": "x"}}},
        {"minutes": {"2026-11-24T12:29": {"completed": 2.5, "poisoned": -4, "latency": [True, "1", None]}}},
        {"written_at": "2026-11-24T12:29:00", "instance": "c", "in_flight": 5},  # no zone
        {"written_at": 12, "in_flight": [1]},
    ]
    assert overview_counters.merge([good, *damaged], NOW) == overview_counters.merge([good], NOW)
    assert overview_counters.merge([good], NOW)["in_flight"] == 2

    counters = TableCounters(MemoryTables(), "metrics", MemoryDocuments(lambda: NOW))
    counters.write("2026-11-24T12", "a", good)
    for i, text in enumerate(["", "{", "[" * 30_000, "[1]", json.dumps("x")]):
        counters.table.upsert({"PartitionKey": "2026-11-24T12", "RowKey": f"bad{i}", "doc": text})
    docs = counters.read(overview_counters.hours_to_read(NOW), None)
    assert docs == [good]


def test_latency_bins_and_percentiles() -> None:
    assert (
        overview_counters.bin_index(0.05) == 0
        and overview_counters.bin_index(0.1) == 0
        and overview_counters.bin_index(7200) == 13
    )
    assert overview_counters.percentile([0] * 14, 0.5) is None
    hist = [0] * 14
    hist[3], hist[13] = 90, 10
    assert overview_counters.percentile(hist, 0.5) == 1.0 and overview_counters.percentile(
        hist, 0.95
    ) == float("inf")


def test_charts_are_inline_svg_with_their_totals() -> None:
    html = svg_lines("t", ["a", "b"], {"completed": [1, 2], "poisoned": [0, 5]})
    assert "<svg" in html and "data-total='3'" in html and "data-total='5'" in html and "http" not in html
    frag = overview_fragment(
        {"depth": {"jobs": 4}, "latency_hist": [1] * 14, "minutes": [], "series": {}},
        overview_counters.LATENCY_BOUNDS_S,
    )
    assert "jobs queue<b>4</b>" in frag and frag.count("class=bar") == 14


# -- edit before replay ---------------------------------------------------------------------


def test_describe_changes_names_dotted_fields() -> None:
    before = {"id": "a", "payload": {"permanent": True, "x": {"y": 1}}}
    after = {"id": "a", "payload": {"note": "n", "x": {"y": 2}}, "kind": "noop"}
    assert describe_changes(before, after) == ["kind", "payload.note", "payload.permanent", "payload.x.y"]


def test_an_edit_is_checked_by_the_envelope_parser_and_the_kinds_own_validation() -> None:
    rt: Any = SimpleNamespace(handlers={"noop": noop.HANDLER, **testing.HANDLERS})
    good = {
        "id": "j1",
        "kind": "fault",
        "payload": {"note": "ok"},
        "attempt": 3,
        "created_at": "2026-11-24T10:00:00Z",
    }
    checked = check_edit(rt, "j1", json.dumps(good))
    assert checked.problems == [] and checked.envelope is not None and checked.envelope.id == "j1"
    assert check_edit(rt, "j1", "{nope").problems[0].startswith("envelope: not JSON")
    problems = check_edit(rt, "j1", json.dumps({**good, "payload": {"transient_failures": "x"}})).problems
    assert problems == ["payload.transient_failures: must be an integer"]
    problems = check_edit(rt, "j1", json.dumps({**good, "id": "j2", "kind": "nope"})).problems
    assert problems[0] == "id: must stay j1 (an edit replays the same job)" and problems[1].startswith(
        "kind: unknown kind"
    )


def test_edited_is_recorded_only_on_a_poisoned_job_then_replayed_in_one_write() -> None:
    facts = Facts(NOW)
    env = Envelope(id="j1", kind="noop", created_at=NOW, payload={})
    poisoned = ledger.poisoned(
        {"id": "j1", "status": "in_progress", "attempt": 2}, "j1", facts, "bad", "x", b"{}"
    )
    data = ledger_operator.replayed(
        ledger_operator.edited(poisoned, "j1", facts, "ann", ["payload.note"], "d1"), env, facts
    )
    assert [h["event"] for h in data["history"]][-3:] == ["poisoned", "edited", "replayed"]
    assert data["history"][-2]["by"] == "ann" and data["history"][-2]["changes"] == ["payload.note"]
    assert data["status"] == "queued" and data["edit_count"] == 1 and data["attempt"] == 0
    with pytest.raises(Conflict):
        ledger_operator.edited({"id": "j1", "status": "completed"}, "j1", facts, "ann", [], "d")


def test_jobs_in_flight_are_counted_while_a_delivery_runs() -> None:
    recorder = overview_counters.Recorder(clock=lambda: NOW)
    with recorder.running(), recorder.running():
        assert recorder.document("2026-11-24T12", "i")["in_flight"] == 2
    with pytest.raises(RuntimeError), recorder.running():
        raise RuntimeError("a failing delivery still leaves")
    assert recorder.document("2026-11-24T12", "i")["in_flight"] == 0


def _request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> Any:
    import azure.functions as func

    url = f"http://127.0.0.1:7071/api/console/{path}"
    return func.HttpRequest(method, url, headers=headers, params={}, route_params={"path": path}, body=body)


def test_routes_refuse_before_touching_storage() -> None:
    from shared.interfaces.console import routes

    answer = routes.handle(_request("GET", "poison", {"host": "jobs.azurewebsites.net"}), AZURE)
    assert answer.status_code == 302  # a page: off to sign in, then back
    assert answer.headers["Location"] == "/.auth/login/aad?post_login_redirect_uri=/api/console/poison"
    answer = routes.handle(_request("GET", "data/poison", {"host": "jobs.azurewebsites.net"}), AZURE)
    assert answer.status_code == 401 and b"sign in" in answer.get_body()
    local = {"host": "127.0.0.1:7071"}
    answer = routes.handle(_request("POST", "action/replay", local, b'{"ids": ["a"]}'), {})
    assert answer.status_code == 403 and b"CSRF" in answer.get_body()
    answer = routes.handle(_request("GET", "poison", local), {}, keyed=True)
    assert answer.status_code == 404, "the admin-key route serves no pages"
    evil = {**local, "origin": "http://evil.example"}
    answer = routes.handle(_request("POST", "action/replay", evil, b"{}"), {}, keyed=True)
    assert answer.status_code == 403 and b"another origin" in answer.get_body()
    assert answer.headers["X-Frame-Options"] == "DENY" and answer.headers["Cache-Control"] == "no-store"


def test_the_timeline_shows_every_fact_of_each_entry_usual_ones_first() -> None:
    history = [
        {
            "at": "t1",
            "event": "claimed",
            "queue_message_id": "m1",
            "dequeue_count": 2,
            "owner": "h/1",
            "attempt": 0,
        },
        {
            "at": "t2",
            "event": "offloaded",
            "seq": 1,
            "delay_s": 10,
            "submission_id": "driver-7",
            "error": None,
        },
    ]
    rows = queries.timeline(history)
    assert list(rows[0]["facts"]) == ["queue_message_id", "dequeue_count", "attempt", "owner"]
    assert rows[1] == {
        "at": "t2",
        "event": "offloaded",
        "facts": {"delay_s": 10, "seq": 1, "submission_id": "driver-7"},
    }


def test_process_message_counts_itself_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.pipeline import processing

    seen: list[int] = []

    def count_then_fail() -> None:
        seen.append(overview_counters.RECORDER.in_flight)
        raise ZeroDivisionError("no runtime in this test")

    monkeypatch.setattr(processing, "get_runtime", count_then_fail)
    before = overview_counters.RECORDER.in_flight
    with pytest.raises(ZeroDivisionError):
        processing.process_message(SimpleNamespace(id="m", dequeue_count=1, get_body=lambda: b"{}"))
    assert seen == [before + 1] and overview_counters.RECORDER.in_flight == before


def test_counter_blobs_older_than_the_retention_are_pruned_and_recent_ones_kept() -> None:
    store = MemoryDocuments(lambda: NOW)
    kept_hours = ["2026-11-22T12", "2026-11-24T11", "2026-11-24T12"]  # 48 h ago is still kept
    gone_hours = ["2026-11-22T11", "2026-11-01T00"]
    for hour in kept_hours + gone_hours:
        for instance in ("host:1", "host:2"):
            store.upsert(overview_counters.blob_name(hour, instance), {"hour": hour})
    store.upsert("jobs/a/1.json", {"other": "archive entry"})  # not a counter blob: never touched
    assert overview_counters.prune(store, NOW) == 4
    left = sorted(name for name, _ in store.names(""))
    assert left == sorted(
        ["jobs/a/1.json"]
        + [overview_counters.blob_name(h, i) for h in kept_hours for i in ("host:1", "host:2")]
    )
    assert overview_counters.prune(store, NOW) == 0
    assert overview_counters.expired(["console/metrics/x", "other/2026-01-01T00/a.json"], NOW) == []


def test_every_console_answer_carries_the_security_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Including the result document, which the API module answers (it had none of them)."""
    import azure.functions as func

    from shared.interfaces import api
    from shared.interfaces.console import routes

    monkeypatch.setattr(api, "get_result", lambda req: func.HttpResponse(b"{}", mimetype="application/json"))
    monkeypatch.setattr(routes, "get_runtime", lambda: None)  # the result route reads nothing else
    local = {"host": "127.0.0.1:7071"}
    answers = [
        routes.handle(_request("GET", "jobs/j1/result", local), {}),
        routes.handle(_request("GET", "poison", {"host": "jobs.azurewebsites.net"}), AZURE),
        routes.handle(_request("PUT", "x", local), {}),
        routes.handle(_request("GET", "data/x", {"host": "evil.example"}), {}, keyed=True),
    ]
    assert answers[0].status_code == 200 and answers[0].get_body() == b"{}", "the result route was reached"
    for answer in answers:
        assert {k: answer.headers.get(k) for k in routes.SAFE_HEADERS} == routes.SAFE_HEADERS


def test_the_local_admin_key_route_refuses_a_rebound_host_before_anything_else() -> None:
    from shared.interfaces.console import routes

    rebound = {"host": "evil.example:7071", "origin": "http://evil.example:7071"}
    answer = routes.handle(
        _request("POST", "action/purge", rebound, b'{"older_than_days": 0}'), {}, keyed=True
    )
    assert answer.status_code == 403 and b"127.0.0.1" in answer.get_body()


def test_a_page_issues_a_bound_token_and_reissues_a_forged_one() -> None:
    from shared.interfaces.console import routes
    from shared.interfaces.console.security import Principal

    def page(headers: dict[str, str]) -> Any:
        req = _request("GET", "poison", headers)
        who = Principal(name="local", how="local")
        return routes._html(routes.Call(req, "poison", "/api/console", who, headers, {}), "t", "")

    local = {"host": "127.0.0.1:7071"}
    token = page(local).headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    assert token_refusal(token, "local:local", csrf_secret({}), float(token.split(".")[0])) is None
    assert "Set-Cookie" not in page({**local, "cookie": f"console_csrf={token}"}).headers
    assert "Set-Cookie" in page({**local, "cookie": "console_csrf=" + "A" * 43}).headers
