"""The fault-injecting proxy (devstack/faultproxy.py) in front of the session's Azurite."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobServiceClient, LinearRetry
from azure.storage.queue import QueueClient

from devstack.azurite import DEV_ACCOUNT, DEV_KEY, Azurite
from devstack.faultproxy import FaultProxy, FaultRule

pytestmark = pytest.mark.integration


@pytest.fixture
def proxy(azurite: Azurite) -> Iterator[FaultProxy]:
    with FaultProxy.for_azurite(azurite) as running:
        yield running


@pytest.fixture
def conn(proxy: FaultProxy, azurite: Azurite) -> str:
    return proxy.route(azurite.connection_string)


@pytest.fixture
def container(conn: str) -> Iterator[str]:
    name = f"fp{uuid.uuid4().hex[:12]}"
    blobs(conn).create_container(name)
    yield name
    blobs(conn).delete_container(name)


def blobs(conn: str, retries: int = 1) -> BlobServiceClient:
    """A client that retries `retries` times without waiting (the default waits ~15 s)."""
    return BlobServiceClient.from_connection_string(
        conn, retry_policy=LinearRetry(backoff=0, retry_total=retries, random_jitter_range=0)
    )


def code(exc: HttpResponseError) -> str | None:
    """The storage error code the SDK read from the answer (x-ms-error-code)."""
    return getattr(exc, "error_code", None)


def blob_path(container: str) -> str:
    return f"^/{DEV_ACCOUNT}/{container}/"


def control(proxy: FaultProxy, method: str, path: str = "", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{proxy.url('blob')}/_faults{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# -- (a) no rules: the SDKs work through the proxy, signatures included ---------------------------


def test_blob_operations_pass_through(proxy: FaultProxy, conn: str, container: str) -> None:
    client = blobs(conn).get_container_client(container)
    blob = client.get_blob_client("a/b c.json")
    created = blob.upload_blob(b"one", match_condition=MatchConditions.IfMissing)
    with pytest.raises(ResourceExistsError):
        blob.upload_blob(b"again", match_condition=MatchConditions.IfMissing)
    updated = blob.upload_blob(
        b"two", overwrite=True, etag=created["etag"], match_condition=MatchConditions.IfNotModified
    )
    with pytest.raises(ResourceModifiedError):
        blob.upload_blob(
            b"stale", overwrite=True, etag=created["etag"], match_condition=MatchConditions.IfNotModified
        )
    big = os.urandom(3 * 1024 * 1024 + 17)
    client.upload_blob("big.bin", big)
    assert blob.download_blob().readall() == b"two"
    assert blob.get_blob_properties().etag == updated["etag"]
    assert client.download_blob("big.bin").readall() == big
    assert sorted(b.name for b in client.list_blobs()) == ["a/b c.json", "big.bin"]
    client.delete_blob("big.bin")
    stats = proxy.stats()
    assert stats["requests"] >= 10
    assert stats["injected"] == stats["connection_errors"] == 0


def test_queue_operations_pass_through(conn: str) -> None:
    queue = QueueClient.from_connection_string(conn, f"fp{uuid.uuid4().hex[:12]}")
    queue.create_queue()
    try:
        for i in range(3):
            queue.send_message(f"message {i}")
        received = list(queue.receive_messages(messages_per_page=32, visibility_timeout=30))
        assert sorted(m.content for m in received) == ["message 0", "message 1", "message 2"]
        for message in received:
            queue.delete_message(message)
        assert list(queue.peek_messages(max_messages=32)) == []
    finally:
        queue.delete_queue()


def test_signature_is_still_checked(azurite: Azurite, conn: str, container: str) -> None:
    """A request signed with another key is refused: the requests that pass are verified ones."""
    wrong = base64.b64encode(os.urandom(64)).decode()
    client = blobs(conn.replace(DEV_KEY, wrong), retries=0).get_container_client(container)
    with pytest.raises(HttpResponseError) as info:
        client.upload_blob("x", b"x")
    assert info.value.status_code == 403
    assert code(info.value) in ("AuthorizationFailure", "AuthenticationFailed")


# -- (b) error rules ------------------------------------------------------------------------------


def test_error_rule_exhausts_retries_then_passes(proxy: FaultProxy, conn: str, container: str) -> None:
    rule = proxy.add(FaultRule("error", methods=("PUT",), path=blob_path(container), count=2))
    blob = blobs(conn, retries=1).get_blob_client(container, "busy")
    with pytest.raises(HttpResponseError) as info:
        blob.upload_blob(b"x")
    assert info.value.status_code == 503
    assert code(info.value) == "ServerBusy"
    assert (rule.matched, rule.injected) == (2, 2)
    blob.upload_blob(b"x")  # the rule is spent
    assert blob.download_blob().readall() == b"x"
    assert (rule.matched, rule.injected) == (3, 2)


def test_error_rule_for_a_duration(proxy: FaultProxy, conn: str, container: str) -> None:
    rule = proxy.add(FaultRule("error", methods=("PUT",), path=blob_path(container), for_s=0.5, since="set"))
    blob = blobs(conn, retries=1).get_blob_client(container, "window")
    with pytest.raises(HttpResponseError):
        blob.upload_blob(b"x")
    time.sleep(0.6)
    blob.upload_blob(b"x")
    assert rule.injected == 2


def test_nth_conditional_write_and_delay(proxy: FaultProxy, conn: str, container: str) -> None:
    rule = proxy.add(FaultRule("error", methods=("PUT",), path=blob_path(container), has_header=("If-None-Match",),
                               nth=2, count=1, status=500, error_code="InternalError"))  # fmt: skip
    client = blobs(conn, retries=0).get_container_client(container)
    client.upload_blob("plain", b"x", overwrite=True)  # no If-None-Match (overwrite=False sends one)
    client.get_blob_client("first").upload_blob(b"x", match_condition=MatchConditions.IfMissing)
    with pytest.raises(HttpResponseError) as info:
        client.get_blob_client("second").upload_blob(b"x", match_condition=MatchConditions.IfMissing)
    assert (info.value.status_code, code(info.value)) == (500, "InternalError")
    assert (rule.matched, rule.injected) == (2, 1)
    proxy.add(FaultRule("delay", methods=("GET",), path=blob_path(container), delay_s=0.3, count=1))
    started = time.monotonic()
    assert client.download_blob("plain").readall() == b"x"
    assert time.monotonic() - started >= 0.3


# -- (c) applied, but unanswered ------------------------------------------------------------------


def test_dropped_answer_to_conditional_create(proxy: FaultProxy, conn: str, container: str) -> None:
    rule = proxy.add(FaultRule("drop_answer", methods=("PUT",), path=blob_path(container),
                               has_header=("If-Match", "If-None-Match"), count=1))  # fmt: skip
    blob = blobs(conn, retries=1).get_blob_client(container, "ledger.json")
    with pytest.raises(HttpResponseError) as info:
        blob.upload_blob(b'{"status": "claimed"}', match_condition=MatchConditions.IfMissing)
    assert info.value.status_code in (409, 412)  # the retry meets the write it does not know it made
    assert code(info.value) in ("BlobAlreadyExists", "ConditionNotMet")
    assert blob.download_blob().readall() == b'{"status": "claimed"}'
    assert rule.injected == 1
    assert rule.dropped_statuses == {201: 1}


def test_dropped_answer_to_conditional_update(proxy: FaultProxy, conn: str, container: str) -> None:
    blob = blobs(conn, retries=1).get_blob_client(container, "ledger.json")
    etag = blob.upload_blob(b"v1")["etag"]
    proxy.add(
        FaultRule(
            "drop_answer", methods=("PUT",), path=blob_path(container), has_header=("If-Match",), count=1
        )
    )
    with pytest.raises(ResourceModifiedError):  # 412 ConditionNotMet: the etag moved on
        blob.upload_blob(b"v2", overwrite=True, etag=etag, match_condition=MatchConditions.IfNotModified)
    assert blob.download_blob().readall() == b"v2"


def test_dropped_answer_without_retries_is_a_connection_error(
    proxy: FaultProxy, conn: str, container: str
) -> None:
    proxy.add(FaultRule("drop_answer", methods=("PUT",), path=blob_path(container), count=1))
    blob = blobs(conn, retries=0).get_blob_client(container, "cut")
    with pytest.raises((ServiceResponseError, ServiceRequestError)):
        blob.upload_blob(b"applied", match_condition=MatchConditions.IfMissing)
    assert blob.download_blob().readall() == b"applied"


# -- (d) the control endpoint ---------------------------------------------------------------------


def test_control_endpoint(proxy: FaultProxy, conn: str, container: str) -> None:
    rule = {"action": "error", "methods": ["GET"], "path": blob_path(container), "count": 1}
    status, answer = control(proxy, "POST", body=rule)
    assert status == 201
    rule_id = answer["rules"][0]["id"]
    url = f"{proxy.url('blob')}/{DEV_ACCOUNT}/{container}/anything"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=10)
    assert info.value.code == 503
    assert info.value.headers["x-ms-error-code"] == "ServerBusy"
    assert b"<Code>ServerBusy</Code>" in info.value.read()
    status, answer = control(proxy, "GET")
    assert status == 200
    assert [(r["id"], r["matched"], r["injected"]) for r in answer["rules"]] == [(rule_id, 1, 1)]
    assert answer["injected"] == 1
    assert control(proxy, "POST", body={"action": "explode"})[0] == 400
    assert control(proxy, "POST", body={"action": "error", "bogus": 1})[0] == 400
    assert control(proxy, "DELETE", f"/{rule_id}") == (200, {"removed": rule_id})
    assert control(proxy, "DELETE", f"/{rule_id}")[0] == 404
    control(proxy, "POST", body=[{"action": "delay", "delay_s": 0.1}, {"action": "drop_answer", "count": 1}])
    assert control(proxy, "DELETE") == (200, {"cleared": 2})
    assert proxy.rules() == []
    blobs(conn).get_container_client(container).upload_blob("after", b"x")  # nothing left set


# -- framing: bytes through unchanged, keep-alive, chunked both ways ------------------------------


def _recorder(listener: socket.socket, requests: list[bytes], answers: list[bytes], got: list[bytes]) -> None:
    """Accept one connection; for each expected request read that many bytes, then send the answer."""
    conn, _ = listener.accept()
    conn.settimeout(5)
    with conn:
        for expected, answer in zip(requests, answers, strict=True):
            data = b""
            while len(data) < len(expected) and (more := conn.recv(65536)):
                data += more
            got.append(data)
            conn.sendall(answer)


def test_bytes_pass_unchanged_with_keep_alive_and_chunked_bodies() -> None:
    requests = [
        b"PUT /devstoreaccount1/c/b?comp=block&blockid=QQ%3D%3D HTTP/1.1\r\nHost: x\r\n"
        b"x-ms-Odd-Case:  spaced \r\nAuthorization: SharedKey a:b=\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n",
        b"POST /devstoreaccount1/q/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
    ]
    answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Case: V\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
    ]
    got: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        upstream = threading.Thread(target=_recorder, args=(listener, requests, answers, got), daemon=True)
        upstream.start()
        with FaultProxy({"blob": listener.getsockname()[1]}) as proxy:
            client = socket.create_connection(("127.0.0.1", proxy.port("blob")), timeout=5)
            with client:
                for request, answer in zip(requests, answers, strict=True):
                    client.sendall(request)
                    data = b""
                    while len(data) < len(answer) and (more := client.recv(65536)):
                        data += more
                    assert data == answer
        upstream.join(timeout=5)
    assert got == requests


def test_chance_faults_some_requests(proxy: FaultProxy, container: str) -> None:
    rule = proxy.add(FaultRule("error", methods=("GET",), path=blob_path(container), chance=0.5))
    codes = []
    for _ in range(60):
        try:
            urllib.request.urlopen(f"{proxy.url('blob')}/{DEV_ACCOUNT}/{container}/nothing", timeout=10)
        except urllib.error.HTTPError as exc:
            codes.append(exc.code)
    assert rule.matched == 60
    assert codes.count(503) == rule.injected
    assert 10 <= rule.injected <= 50  # a binomial(60, 0.5) lands here all but ~1e-7 of the time
