"""The console in a real headless Chromium (Debian's chromium + chromium-driver, through Selenium)
against the running stack: Azurite and the local Functions host with the shipped host.json.

Screenshots of the overview, a job's timeline and the poison page go to build/screenshots/ (the
tree a test run leaves stays clean); `CONSOLE_SCREENSHOTS_DIR=docs/screenshots` refreshes the docs' copies."""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from devstack.azurite import Azurite
from devstack.hostproc import REPO_ROOT, HostProcess, count_decisions
from shared.config.settings import Settings
from shared.storage.clients import clients_for
from tests.handlerkit import Receiver, Reply
from tests.integration.helpers import local_host, unique

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402

pytestmark = pytest.mark.integration
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SHOTS = REPO_ROOT / os.environ.get("CONSOLE_SCREENSHOTS_DIR", "build/screenshots")
SECRET = "console-partner-token-7e41c9d0b3"
"""The http kind's secret header value (app setting HTTP_SECRET_CONSOLE): never on a page."""


def attribute(element: WebElement, name: str) -> str:
    """An attribute the test expects the element to have."""
    value = element.get_attribute(name)
    assert value is not None, f"no {name} attribute"
    return value


def text_property(element: WebElement, name: str) -> str:
    """A DOM property the test expects to be a string (an input's `value`)."""
    value = element.get_property(name)
    assert isinstance(value, str), f"{name} is {value!r}"
    return value


class Stack:
    def __init__(self, host: HostProcess, settings: Settings, log: Path) -> None:
        self.host = host
        self.settings = settings
        self.log = log
        self.storage = clients_for(settings.storage)

    @property
    def console(self) -> str:
        return f"{self.host.url}/api/console"

    def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.host.url}/api/{path}", data=data, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def submit(self, job_id: str, kind: str, payload: dict[str, Any]) -> None:
        status, body = self.call("POST", "jobs", {"id": job_id, "kind": kind, "payload": payload})
        assert status == 202, body

    def record(self, job_id: str) -> dict[str, Any]:
        status, body = self.call("GET", f"jobs/{job_id}")
        assert status == 200, body
        return dict(body)

    def queue_length(self, name: str) -> int:
        count = self.storage.raw_queue(name).get_queue_properties().approximate_message_count
        assert count is not None
        return count

    def archived(self) -> dict[str, Any]:
        status, body = self.call("GET", "console/data/poison")
        assert status == 200, body
        return dict(body)


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """Poll `check` until it is true. Pages that reload themselves (after an action, an
    operation's, a running job's) may replace an element or the whole document between finding
    and reading it: such a WebDriver error counts as "not yet", and the last one is named if
    the check never comes true."""
    deadline = time.monotonic() + timeout_s
    last_error: WebDriverException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except WebDriverException as error:
            value, last_error = None, error
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not true after {timeout_s:.0f}s: {what} (last WebDriver error: {last_error!r})")


@pytest.fixture
def receiver(module_receiver: Receiver) -> Receiver:
    """The module's receiver (its port is in the stack's HTTP_ALLOWED_HOSTS, that port only)."""
    return module_receiver.reset()


@pytest.fixture(scope="module")
def stack(
    azurite: Azurite, module_receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    values = {
        "JOBS_QUEUES": f"{unique('con')},{unique('gold')}",  # the tests use the first, one the second
        "LEDGER_CONTAINER": unique("ledger"),
        "RESULTS_CONTAINER": unique("res"),
        "PAYLOADS_CONTAINER": unique("pay"),
        "POISON_ARCHIVE_CONTAINER": unique("arch"),
        "ENABLE_TEST_KINDS": "1",
        "HTTP_ALLOWED_HOSTS": module_receiver.allow,  # the scripted receiver's address and port
        "HTTP_SECRET_CONSOLE": SECRET,
        "HTTP_SECRET_CONSOLE_HOSTS": module_receiver.allow,
    }
    log = tmp_path_factory.mktemp("console") / "host.log"
    with local_host(azurite, values, log) as host:
        yield Stack(
            host, Settings.from_env({**values, "AzureWebJobsStorage": azurite.connection_string}), log
        )


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium')}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: WebDriver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return Math.min(2400, document.body.scrollHeight + 40)")
    driver.set_window_size(1280, max(700, int(height)))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
    driver.set_window_size(1280, 1000)


def poisoned_and_archived(stack: Stack, job_ids: list[str]) -> None:
    def done() -> bool:
        listed = {e["job_id"] for e in stack.archived()["archived"]}
        return all(stack.record(j)["status"] == "poisoned" for j in job_ids) and set(job_ids) <= listed

    wait_for(f"{len(job_ids)} jobs poisoned and archived", done, timeout_s=90)


def row_of(driver: WebDriver, table: str, job_id: str) -> Any:
    """The table row of a job, or None when it is not listed. Found in one script run inside the
    page, so a table the page re-renders meanwhile cannot hand back a row from the old one (a
    row-by-row search in WebDriver calls could, and could read "gone" from a stale row)."""
    return driver.execute_script(
        "const pick = document.querySelector(`#${arguments[0]} input.pick[data-job='${arguments[1]}']`);"
        " return pick ? pick.closest('tr') : null;",
        table,
        job_id,
    )


def test_poisoned_job_is_listed_edited_validated_and_replayed(stack: Stack, browser: WebDriver) -> None:
    job = unique("edit-")
    stack.submit(job, "fault", {"permanent": True})
    poisoned_and_archived(stack, [job])
    browser.get(f"{stack.console}/poison")
    row = row_of(browser, "archived", job)
    assert row is not None, "the poisoned job is not on the poison page"
    assert "permanent failure requested" in row.find_element(By.CSS_SELECTOR, ".reason").text

    browser.get(f"{stack.console}/jobs/{job}")
    editor = browser.find_element(By.ID, "envelope")
    envelope = json.loads(text_property(editor, "value"))
    assert envelope["payload"] == {"permanent": True}

    # an invalid edit: refused with the field named, nothing enqueued, the job still poisoned
    bad = {**envelope, "payload": {"transient_failures": "three"}}
    browser.execute_script("arguments[0].value = arguments[1]", editor, json.dumps(bad))
    browser.find_element(By.ID, "replay-edited").click()
    problem = wait_for("problems shown", lambda: browser.find_elements(By.CSS_SELECTOR, "#problems li"), 10)[
        0
    ]
    assert problem.get_attribute("data-field") == "payload.transient_failures"
    assert stack.record(job)["status"] == "poisoned"
    assert stack.queue_length(stack.settings.jobs_queue) == 0

    # a valid edit: replayed under the same id, and it completes
    good = {**envelope, "payload": {"note": "fixed by an operator"}}
    browser.execute_script("arguments[0].value = arguments[1]", editor, json.dumps(good))
    browser.find_element(By.ID, "validate").click()
    wait_for("valid", lambda: browser.find_element(By.ID, "status").text == "valid", 10)
    browser.find_element(By.ID, "replay-edited").click()
    wait_for("completed", lambda: stack.record(job)["status"] == "completed", 60)
    record = stack.record(job)
    edited = [h for h in record["history"] if h["event"] == "edited"]
    assert len(edited) == 1 and edited[0]["by"] == "local"
    assert edited[0]["changes"] == ["payload.note", "payload.permanent"]
    entries = stack.archived()
    assert job not in {e["job_id"] for e in entries["archived"]}  # replayed; the original stays archived
    names = [
        n
        for n, _ in [
            (b.name, 0)
            for b in stack.storage.container(stack.settings.poison_archive_container).list_blobs(
                name_starts_with=f"jobs/{job}/"
            )
        ]
    ]
    assert len(names) == 1

    with urllib.request.urlopen(f"{stack.console}/jobs/{job}/result", timeout=60) as resp:
        assert "script-src 'sha256-" in resp.headers["Content-Security-Policy"]  # the result too
        assert resp.headers["X-Frame-Options"] == "DENY"
    browser.get(f"{stack.console}/jobs?id={job}")  # find by id: straight to the job's page
    assert browser.current_url.endswith(f"/api/console/jobs/{job}")
    events = [li.get_attribute("data-event") for li in browser.find_elements(By.CSS_SELECTOR, "#timeline li")]
    assert events[-3:] == ["edited", "replayed", "completed"] or events[-4:-1] == [
        "edited",
        "replayed",
        "claimed",
    ]
    assert browser.find_element(By.ID, "job-status").text == "completed"
    assert json.loads(browser.find_element(By.ID, "payload").text) == {"note": "fixed by an operator"}
    assert attribute(browser.find_element(By.ID, "result-link"), "href").endswith(
        f"/api/console/jobs/{job}/result"
    )
    shot(browser, "job-timeline")


def test_unknown_kind_job_without_a_record_is_poisoned_edited_and_replayed(
    stack: Stack, browser: WebDriver
) -> None:
    """Put raw (no base64, no API): the job has no record until its body is refused."""
    job = unique("unk-")
    queue = stack.storage.raw_queue(stack.settings.jobs_queue)
    queue.send_message(json.dumps({"id": job, "kind": "nope", "payload": {"note": "x"}}))
    wait_for("poisoned", lambda: stack.call("GET", f"jobs/{job}")[0] == 200)
    record = stack.record(job)
    assert record["status"] == "poisoned" and "unknown kind 'nope'" in record["reason"]
    poisoned_and_archived(stack, [job])

    browser.get(f"{stack.console}/jobs/{job}")
    assert "unknown kind 'nope'" in browser.find_element(By.ID, "reason").text
    editor = browser.find_element(By.ID, "envelope")
    envelope = json.loads(text_property(editor, "value"))
    assert envelope["kind"] == "nope"
    browser.execute_script(
        "arguments[0].value = arguments[1]", editor, json.dumps({**envelope, "kind": "noop"})
    )
    browser.find_element(By.ID, "replay-edited").click()
    wait_for("completed", lambda: stack.record(job)["status"] == "completed", 60)
    edited = [h for h in stack.record(job)["history"] if h["event"] == "edited"]
    assert len(edited) == 1 and edited[0]["changes"] == ["kind"]


def test_garbage_body_is_shown_as_hex_then_fixed_and_replayed(stack: Stack, browser: WebDriver) -> None:
    garbage = b"\xff\xfe\x00" + unique("").encode()
    queue = stack.storage.raw_queue(stack.settings.jobs_queue)
    queue.send_message(base64.b64encode(garbage).decode())

    def entry() -> Any:
        for e in stack.archived()["archived"]:
            if e["name"].startswith("unparsed/"):
                status, doc = stack.call("GET", f"console/data/entry?name={e['name']}")
                if status == 200 and base64.b64decode(doc["body_b64"]) == garbage:
                    return doc
        return None

    name = wait_for("garbage listed", entry, 60)["name"]
    browser.get(f"{stack.console}/poison")
    link = next(
        a
        for a in browser.find_elements(By.CSS_SELECTOR, "a.entry")
        if urlencode({"name": name}) in attribute(a, "href")
    )
    link.click()
    assert browser.find_element(By.ID, "body-hex").text == garbage.hex(" ")
    fixed = browser.find_element(By.ID, "fixed")
    job = unique("fixed-")
    browser.execute_script(
        "arguments[0].value = arguments[1]", fixed, json.dumps({"id": job, "kind": "noop", "payload": {}})
    )
    browser.find_element(By.ID, "replay-fixed").click()
    wait_for("fixed job completed", lambda: stack.call("GET", f"jobs/{job}")[1].get("status") == "completed")
    assert entry() is None  # no longer listed: marked replayed, kept in the archive


def test_replay_of_50_at_a_rate_shows_progress_and_moves_each_once(stack: Stack, browser: WebDriver) -> None:
    marker = unique("fix-")
    jobs = [f"{marker}-{i:02d}" for i in range(50)]
    for job in jobs:
        stack.submit(job, "fault", {"fail_unless_blob": marker})
    poisoned_and_archived(stack, jobs)
    stack.storage.container(stack.settings.results_container).upload_blob(marker, b"fixed")

    browser.get(f"{stack.console}/jobs?status=poisoned&kind=fault&id={marker}&fresh=1")
    listed = [
        row.find_elements(By.TAG_NAME, "td") for row in browser.find_elements(By.CSS_SELECTOR, "#jobs tr")[1:]
    ]
    assert sorted(cells[0].text for cells in listed) == jobs
    assert {(cells[1].text, cells[2].text) for cells in listed} == {("poisoned", "fault")}
    created = [cells[3].text for cells in listed]
    assert created == sorted(created, reverse=True), "newest first"
    assert "page 1" in browser.page_source  # paged by the jobs index: no total is counted

    browser.get(f"{stack.console}/poison")
    for job in jobs:
        row_of(browser, "archived", job).find_element(By.CSS_SELECTOR, "input.pick").click()
    browser.find_element(By.ID, "rate").clear()
    browser.find_element(By.ID, "rate").send_keys("25")
    shot(browser, "poison")
    browser.find_element(By.ID, "replay").click()
    seen: set[int] = set()
    deadline = time.monotonic() + 120  # 2 s at 25/s; the margin is for a loaded machine, not a speed check
    while time.monotonic() < deadline:
        seen.add(int(float(browser.find_element(By.ID, "progress").get_attribute("value") or 0)))
        if 50 in seen:
            break
        time.sleep(0.1)
    assert 50 in seen and any(0 < v < 50 for v in seen), seen
    assert browser.find_element(By.ID, "progress-text").text == "50 / 50"
    wait_for("replayed 50", lambda: "replayed 50 of 50" in browser.find_element(By.ID, "status").text, 10)

    wait_for("all 50 completed", lambda: all(stack.record(j)["status"] == "completed" for j in jobs), 90)
    for job in jobs:
        record = stack.record(job)
        assert record["replay_count"] == 1
        assert sum(1 for h in record["history"] if h["event"] == "replayed") == 1
        assert sum(1 for h in record["history"] if h["event"] == "completed") == 1
    replays = [
        json.loads(line[line.find('{"decision"') :])
        for line in stack.log.read_text().splitlines()
        if '"decision": "replayed"' in line
    ]
    assert sorted(r["job_id"] for r in replays if r["job_id"].startswith(marker)) == jobs


def test_park_unpark_keep_the_message_and_delete_asks_first(stack: Stack, browser: WebDriver) -> None:
    job, other = unique("park-"), unique("del-")
    stack.submit(job, "fault", {"permanent": True, "note": "park me"})
    stack.submit(other, "fault", {"permanent": True})
    poisoned_and_archived(stack, [job, other])
    entry = next(e for e in stack.archived()["archived"] if e["job_id"] == job)
    archive = stack.storage.container(stack.settings.poison_archive_container)
    body = json.loads(archive.download_blob(entry["name"]).readall())["body_b64"]
    parked_queue = stack.storage.raw_queue(stack.settings.parked_queue)

    browser.get(f"{stack.console}/poison")
    row_of(browser, "archived", job).find_element(By.CSS_SELECTOR, "input.pick").click()
    browser.find_element(By.ID, "park").click()
    wait_for("parked listed", lambda: row_of(browser, "parked", job) is not None, 10)
    assert row_of(browser, "archived", job) is None
    on_queue = list(parked_queue.peek_messages(max_messages=32))
    assert [m.content for m in on_queue] == [body]
    assert json.loads(base64.b64decode(body))["payload"]["note"] == "park me"

    row_of(browser, "parked", job).find_element(By.CSS_SELECTOR, "input.pick").click()
    browser.find_element(By.ID, "unpark").click()
    wait_for("back in the archived list", lambda: row_of(browser, "archived", job) is not None, 10)
    assert list(parked_queue.peek_messages(max_messages=32)) == []
    assert json.loads(archive.download_blob(entry["name"]).readall())["body_b64"] == body

    row_of(browser, "archived", other).find_element(By.CSS_SELECTOR, "input.pick").click()
    browser.find_element(By.ID, "delete").click()
    browser.switch_to.alert.dismiss()  # asked first: nothing deleted
    assert other in {e["job_id"] for e in stack.archived()["archived"]}
    browser.find_element(By.ID, "delete").click()
    browser.switch_to.alert.accept()
    wait_for("deleted", lambda: row_of(browser, "archived", other) is None, 10)
    assert other not in {e["job_id"] for e in stack.archived()["archived"]}


def test_a_change_without_the_csrf_token_is_refused(stack: Stack, browser: WebDriver) -> None:
    job = unique("csrf-")
    stack.submit(job, "fault", {"permanent": True})
    poisoned_and_archived(stack, [job])
    browser.get(f"{stack.console}/poison")
    script = """
        const done = arguments[arguments.length - 1];
        fetch(arguments[0], {method: 'POST', credentials: 'same-origin', headers: {'Content-Type': 'application/json'},
              body: JSON.stringify({ids: [arguments[1]], rate: 10})})
          .then(r => r.json().then(b => done([r.status, b.error])));
    """
    status, error = browser.execute_async_script(script, f"{stack.console}/action/replay", job)
    assert status == 403 and "CSRF" in error
    assert stack.call("POST", "console/action/replay", {"ids": [job], "rate": 10})[0] == 403
    cookie = browser.get_cookie("console_csrf")
    assert cookie is not None and cookie["sameSite"] == "Strict" and cookie["httpOnly"]
    forged = {
        "Cookie": f"console_csrf={cookie['value']}",
        "X-Console-CSRF": cookie["value"],
        "Origin": "http://evil.example",
    }
    assert stack.call("POST", "console/action/replay", {"ids": [job], "rate": 10}, forged)[0] == 403
    made_up = {"Cookie": "console_csrf=" + "A" * 43, "X-Console-CSRF": "A" * 43}  # equal, but not ours
    assert stack.call("POST", "console/action/replay", {"ids": [job], "rate": 10}, made_up)[0] == 403
    sandboxed = {**forged, "Origin": "null"}
    assert stack.call("POST", "console/action/replay", {"ids": [job], "rate": 10}, sandboxed)[0] == 403
    rebound = {"Host": f"evil.example:{stack.host.url.rsplit(':', 1)[1]}"}  # DNS rebinding: no key locally
    status, body = stack.call("POST", "console-api/action/purge", {"older_than_days": 0}, rebound)
    assert status == 403 and "127.0.0.1" in body["error"]
    assert stack.record(job)["status"] == "poisoned" and stack.queue_length(stack.settings.jobs_queue) == 0
    # scripts use the admin-key route (key in a header; no key is needed on the local host), no cookie
    edit = {"job_id": job, "envelope": json.dumps({"id": job, "kind": "noop", "payload": {}})}
    assert stack.call("POST", "console-api/action/validate", edit) == (200, {"valid": True, "problems": []})
    assert stack.call("GET", "console-api/poison")[0] == 404
    assert count_decisions(stack.log)["console_action"] >= 1  # the earlier actions were logged as decisions


def test_overview_charts_render_with_data(stack: Stack, browser: WebDriver) -> None:
    for i in range(5):
        stack.submit(unique(f"ok{i}-"), "noop", {"note": "chart"})
    wait_for("jobs queue drained", lambda: stack.queue_length(stack.settings.jobs_queue) == 0, 60)
    browser.get(stack.console)
    nav = browser.find_element(By.TAG_NAME, "nav").value_of_css_property("background-color")
    assert nav in ("rgba(36, 41, 47, 1)", "rgb(36, 41, 47)"), "the inlined stylesheet is allowed by its hash"
    total = browser.find_element(By.CSS_SELECTOR, "polyline[data-series='completed']").get_attribute(
        "data-total"
    )
    assert int(total or 0) >= 5
    bars = [
        int(b.get_attribute("data-value") or 0) for b in browser.find_elements(By.CSS_SELECTOR, "rect.bar")
    ]
    assert sum(bars) >= 5
    p50 = browser.find_element(By.CSS_SELECTOR, "[data-card='latency p50 (1 h)'] b").text
    assert p50.startswith("≤")
    wait_for("refreshed", lambda: browser.find_element(By.ID, "overview").get_attribute("data-refreshed"), 12)
    assert browser.find_elements(By.CSS_SELECTOR, "polyline[data-series='poisoned']")
    shot(browser, "overview")


def test_search_replays_all_matching_in_the_app_and_the_audit_shows_it(
    stack: Stack, browser: WebDriver
) -> None:
    marker = unique("needle-")
    jobs = [f"{marker}-{i}" for i in range(3)]
    for job in jobs:
        stack.submit(job, "fault", {"fail_unless_blob": marker})
    poisoned_and_archived(stack, jobs)
    stack.storage.container(stack.settings.results_container).upload_blob(marker, b"fixed")
    today = time.strftime("%Y-%m-%d", time.gmtime())

    browser.get(f"{stack.console}/jobs?id={marker}&from={today}&to={today}")
    assert (
        sorted(r.text.split(" ")[0] for r in browser.find_elements(By.CSS_SELECTOR, "#jobs tr")[1:]) == jobs
    )
    browser.get(f"{stack.console}/jobs?id={marker}&from=2999-01-01")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs tr")) == 1, (
        "none created from then: the header only"
    )

    browser.get(f"{stack.console}/poison")
    group = browser.find_element(By.CSS_SELECTOR, "#groups tr[data-group='bad_input_data'] td[data-count]")
    assert int(group.text) >= 3
    browser.find_element(By.ID, "q").send_keys(marker)
    browser.find_element(By.CSS_SELECTOR, "#search button").click()
    wait_for("the search's page", lambda: f"q={marker}" in browser.current_url, 10)
    assert (
        sorted(
            attribute(p, "data-job") for p in browser.find_elements(By.CSS_SELECTOR, "#archived input.pick")
        )
        == jobs
    )
    browser.find_element(By.ID, "replay-all").click()
    browser.switch_to.alert.accept()
    wait_for("the operation's page", lambda: "/ops/" in browser.current_url, 10)
    wait_for("done", lambda: browser.find_element(By.ID, "op-status").text == "done", 60)
    assert browser.find_element(By.CSS_SELECTOR, "[data-count='replayed']").text == "3"
    wait_for("all 3 completed", lambda: all(stack.record(j)["status"] == "completed" for j in jobs), 90)

    browser.get(f"{stack.console}/audit")
    newest = browser.find_element(By.CSS_SELECTOR, "#audit tr[data-action]")
    assert newest.get_attribute("data-action") == "op_start" and marker in newest.text


def downstream_shown(driver: WebDriver) -> list[str]:
    return [
        attribute(row, "data-status")
        for row in driver.find_elements(By.CSS_SELECTOR, "#downstream tr[data-status]")
    ]


def test_an_http_job_shows_each_calls_status_and_edit_before_replay_gives_a_new_key(
    stack: Stack, browser: WebDriver, receiver: Receiver
) -> None:
    """A 400 poisons the job; a plain replay (400 again) calls with the same Idempotency-Key, an
    edited one (200) with a new key. The page shows each call's status; the secret header is sent
    each time and stays a reference everywhere else: the archive, the edit, the ledger, the page."""
    job = unique("http-")
    payload = {
        "url": receiver.url(),
        "headers": {"Authorization": {"secret": "HTTP_SECRET_CONSOLE"}},
        "body": {"order": 1},
    }
    receiver.reply(Reply(400, "amount is missing"), Reply(400, "amount is missing"))
    stack.submit(job, "http", payload)
    poisoned_and_archived(stack, [job])
    browser.get(f"{stack.console}/jobs/{job}")
    assert downstream_shown(browser) == ["400"]
    assert "HTTP 400" in browser.find_element(By.ID, "reason").text

    # a plain replay: the same payload version, the same key
    browser.get(f"{stack.console}/poison")
    row_of(browser, "archived", job).find_element(By.CSS_SELECTOR, "input.pick").click()
    browser.find_element(By.ID, "replay").click()
    wait_for("called again", lambda: len(receiver.requests) == 2, 60)
    wait_for(
        "poisoned again",
        lambda: stack.record(job)["status"] == "poisoned" and stack.record(job).get("replay_count") == 1,
        60,
    )
    poisoned_and_archived(stack, [job])

    # edit before replay: the body fixed, the secret header still a reference; a new key
    browser.get(f"{stack.console}/jobs/{job}")
    assert downstream_shown(browser) == ["400", "400"]
    editor = browser.find_element(By.ID, "envelope")
    envelope = json.loads(text_property(editor, "value"))
    assert envelope["payload"]["headers"] == {"Authorization": {"secret": "HTTP_SECRET_CONSOLE"}}
    envelope["payload"]["body"] = {"order": 1, "amount": 5}
    browser.execute_script("arguments[0].value = arguments[1]", editor, json.dumps(envelope))
    browser.find_element(By.ID, "replay-edited").click()
    wait_for("completed", lambda: stack.record(job)["status"] == "completed", 60)

    first, plain, edited = receiver.requests
    assert [r.headers["Authorization"] for r in receiver.requests] == [SECRET] * 3
    assert plain.headers["Idempotency-Key"] == first.headers["Idempotency-Key"]
    assert edited.headers["Idempotency-Key"] != first.headers["Idempotency-Key"]
    assert json.loads(edited.body) == {"order": 1, "amount": 5}
    browser.get(f"{stack.console}/jobs/{job}")
    assert downstream_shown(browser) == ["400", "400", "200"]
    assert "(replay 2)" in browser.find_element(By.ID, "downstream").text
    assert SECRET not in browser.page_source
    browser.get(f"{stack.console}/audit")
    assert job in browser.page_source and SECRET not in browser.page_source
    assert SECRET not in json.dumps(stack.record(job))
    archive = stack.storage.container(stack.settings.poison_archive_container)
    stored = [
        b.name
        for prefix in (f"jobs/{job}/", f"edits/{job}/")
        for b in archive.list_blobs(name_starts_with=prefix)
    ]
    assert any(n.startswith("edits/") for n in stored) and any(n.startswith("jobs/") for n in stored)
    for name in stored:
        raw = archive.get_blob_client(name).download_blob().readall()
        body = base64.b64decode(json.loads(raw).get("body_b64", ""))  # the archived or edited envelope
        assert b"HTTP_SECRET_CONSOLE" in body and SECRET.encode() not in raw + body, name
    ledger = stack.storage.container(stack.settings.ledger_container)
    assert SECRET.encode() not in ledger.get_blob_client(f"{job}.json").download_blob().readall()
    assert SECRET not in stack.log.read_text(encoding="utf-8")


def test_a_second_queues_job_is_shown_by_queue_edited_and_replayed_to_its_queue(
    stack: Stack, browser: WebDriver
) -> None:
    gold = stack.settings.queue_set.names[1]
    job = unique("gold-")
    body = {"id": job, "kind": "fault", "payload": {"permanent": True}, "queue": gold}
    assert stack.call("POST", "jobs", body)[0] == 202

    def listed() -> bool:
        status, page = stack.call("GET", f"console/data/poison?queue={gold}")
        return status == 200 and f"{gold}/{job}" in {e["job_id"] for e in page["archived"]}

    wait_for("poisoned and archived on its queue", listed, timeout_s=90)
    browser.get(f"{stack.console}/poison?queue={gold}")
    row = row_of(browser, "archived", f"{gold}/{job}")
    assert row is not None, "the second queue's job is not on its poison page"
    link = attribute(row.find_element(By.CSS_SELECTOR, "a"), "href")
    assert link.endswith(f"/api/console/jobs/{job}?queue={gold}")
    browser.get(link)
    assert browser.find_element(By.ID, "job-queue").text == gold
    editor = browser.find_element(By.ID, "envelope")
    envelope = json.loads(text_property(editor, "value"))
    browser.execute_script(
        "arguments[0].value = arguments[1]",
        editor,
        json.dumps({**envelope, "payload": {"note": "gold, fixed"}}),
    )
    browser.find_element(By.ID, "replay-edited").click()

    def completed() -> bool:
        status, record = stack.call("GET", f"jobs/{job}?queue={gold}")
        return status == 200 and record["status"] == "completed"

    wait_for("completed on its own queue", completed, timeout_s=60)
    assert stack.call("GET", f"jobs/{job}")[0] == 404, "nothing went to the default queue"
    browser.get(f"{stack.console}/?queue={gold}")
    assert browser.find_elements(By.CSS_SELECTOR, f"#queues tr[data-queue='{gold}']")
