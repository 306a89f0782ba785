"""Seeding the console benchmark's Azurite fast: real ledger records and index entities, written
directly (not through the queue).

What made seeding ~4x faster than one Azurite process and the SDK (measured on the shared 2-core
machine; figures in docs/operations.md):
- Azurite's three services as three processes (`azurite-blob`, `azurite-queue`, `azurite-table`,
  each `--inMemoryPersistence`): Azurite serves every request on one Node thread, so blob PUTs and
  table transactions in one process queue behind each other; apart they run on both cores.
- Ledger records PUT over raw keep-alive `http.client` connections (32 in flight) with Shared Key
  signing: the SDK's pipeline costs more client CPU per request than Azurite's answer.
- Index entities in entity group transactions of 100 (one request per 100 jobs), 2 in flight
  (Azurite refuses overlapping transactions on a table with a reset connection).
- One pass over the records: the records are built once (by the ledger's own transitions, so
  they are what the app writes and reads) and each becomes a blob body and an index entity.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import math
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import formatdate
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from azure.core.exceptions import HttpResponseError, ServiceResponseError

from devstack.azurite import AZURITE_BIN, DEV_ACCOUNT, DEV_KEY
from devstack.ports import free_port, wait_for_port
from shared import ledger
from shared.documents import dump
from shared.entry_index import COUNT_PARTITION, shard_of
from shared.entry_index import entity_of as entry_entity
from shared.envelope import isoformat, utcnow
from shared.job_index import entity_of as job_entity
from shared.ledger import Facts
from shared.ledger_view import index_tags, listing_metadata
from shared.poison.archive import entry_name, new_entry
from shared.runtime import Runtime

BLOB_THREADS = 32
TABLE_THREADS = 2
"""Transactions in flight: Azurite resets connections when transactions on a table overlap more."""
API_VERSION = "2021-08-06"


# -- Azurite, one process per service ----------------------------------------------------------


@dataclass
class SplitAzurite:
    """Azurite's blob, queue and table services as three in-memory processes on free ports."""

    blob_port: int = field(default_factory=free_port)
    queue_port: int = field(default_factory=free_port)
    table_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def connection_string(self) -> str:
        return (
            "DefaultEndpointsProtocol=http;"
            f"AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{self.blob_port}/{DEV_ACCOUNT};"
            f"QueueEndpoint=http://127.0.0.1:{self.queue_port}/{DEV_ACCOUNT};"
            f"TableEndpoint=http://127.0.0.1:{self.table_port}/{DEV_ACCOUNT};"
        )

    def start(self, log_path: Path | None = None) -> None:
        common = [
            "--silent",
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--loose",
            "--inMemoryPersistence",
        ]
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        for service, port in (
            ("blob", self.blob_port),
            ("queue", self.queue_port),
            ("table", self.table_port),
        ):
            binary = AZURITE_BIN.with_name(f"azurite-{service}")
            args = [str(binary), *common, f"--{service}Host", "127.0.0.1", f"--{service}Port", str(port)]
            self.processes.append(
                subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            )
        for port in (self.blob_port, self.queue_port, self.table_port):
            wait_for_port(port)

    def cleanup(self) -> None:
        for proc in self.processes:  # only the processes this object started, by their handle
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.processes.clear()


def split_available() -> bool:
    return AZURITE_BIN.with_name("azurite-blob").exists() and shutil.which("node") is not None


# -- raw blob PUTs ----------------------------------------------------------------------------


class BlobPutter:
    """Put Blob over keep-alive `http.client` connections (one per thread), Shared Key signed."""

    def __init__(self, connection_string: str) -> None:
        parts = dict(p.split("=", 1) for p in connection_string.split(";") if "=" in p)
        url = urlsplit(parts["BlobEndpoint"])
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.prefix = url.path.rstrip("/")
        self.account = parts["AccountName"]
        self.key = base64.b64decode(parts["AccountKey"])
        self._local = threading.local()
        self.requests = 0
        self._lock = threading.Lock()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        return conn

    def put(
        self,
        container: str,
        name: str,
        body: bytes,
        metadata: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        path = f"{self.prefix}/{container}/{quote(name)}"
        headers = {"x-ms-blob-type": "BlockBlob", "x-ms-version": API_VERSION}
        for key, value in (metadata or {}).items():
            headers[f"x-ms-meta-{key}"] = value
        if tags:
            headers["x-ms-tags"] = urlencode(tags, quote_via=quote)
        for attempt in range(5):
            headers["x-ms-date"] = formatdate(usegmt=True)
            canonical = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
            text = f"PUT\n\n\n{len(body)}\n\napplication/json\n\n\n\n\n\n\n{canonical}/{self.account}{path}"
            signature = base64.b64encode(hmac.new(self.key, text.encode(), hashlib.sha256).digest()).decode()
            sent = {
                **headers,
                "Content-Type": "application/json",
                "Content-Length": str(len(body)),
                "Authorization": f"SharedKey {self.account}:{signature}",
            }
            try:
                conn = self._conn()
                conn.request("PUT", path, body=body, headers=sent)
                resp = conn.getresponse()
                answer = resp.read()
            except (OSError, http.client.HTTPException):  # a kept-alive connection the server closed
                self._local.conn = None
                time.sleep(0.2 * attempt)
                continue
            with self._lock:
                self.requests += 1
            if resp.status == 201:
                return
            if resp.status < 500 or attempt == 4:
                raise RuntimeError(f"PUT {path}: {resp.status} {answer[:300]!r}")
        raise RuntimeError(f"PUT {path}: no answer after 5 tries")


# -- bounded concurrent work ------------------------------------------------------------------


class Lanes:
    """Two pools (blobs, table transactions) fed by one producer, each with bounded pending work;
    the first error is raised on `wait`."""

    def __init__(self, blob_threads: int = BLOB_THREADS, table_threads: int = TABLE_THREADS) -> None:
        self.blobs = ThreadPoolExecutor(blob_threads)
        self.tables = ThreadPoolExecutor(table_threads)
        self.blob_slots = threading.BoundedSemaphore(blob_threads * 2)
        self.table_slots = threading.BoundedSemaphore(table_threads * 4)
        self.errors: list[BaseException] = []
        self.pending: list[Future[Any]] = []

    def _submit(
        self, pool: ThreadPoolExecutor, slots: threading.BoundedSemaphore, fn: Callable[[], None]
    ) -> None:
        if self.errors:
            raise self.errors[0]
        slots.acquire()
        future = pool.submit(fn)

        def done(f: Future[Any]) -> None:
            slots.release()
            if f.exception() is not None:
                self.errors.append(f.exception())  # type: ignore[arg-type]

        future.add_done_callback(done)

    def blob(self, fn: Callable[[], None]) -> None:
        self._submit(self.blobs, self.blob_slots, fn)

    def table(self, fn: Callable[[], None]) -> None:
        self._submit(self.tables, self.table_slots, fn)

    def wait(self) -> None:
        self.blobs.shutdown(wait=True)
        self.tables.shutdown(wait=True)
        if self.errors:
            raise self.errors[0]


def submit_transaction(client: Any, chunk: list[dict[str, Any]], tries: int = 6) -> None:
    """One entity group transaction of upserts, sent again when the connection was reset or
    Azurite refused an overlapping transaction (an upsert is idempotent)."""
    for attempt in range(tries):
        try:
            client.submit_transaction([("upsert", e) for e in chunk])
            return
        except (ServiceResponseError, HttpResponseError) as exc:
            status = getattr(exc, "status_code", None)
            if attempt == tries - 1 or (status is not None and status < 500):
                raise
            time.sleep(0.5 + attempt)


# -- the records ------------------------------------------------------------------------------


def job_record(i: int, created: Any) -> dict[str, Any]:
    """Job `i`'s ledger record, built by the ledger's own transitions: 98% completed, 2% poisoned
    (reason code bad_input_data); a third are `aggregate`, the rest `noop`."""
    job_id = f"job-{i:07d}"
    kind = "noop" if i % 3 else "aggregate"
    start = {"id": job_id, "kind": kind, "attempt": 0, "created_at": isoformat(created)}
    facts = Facts(created + timedelta(milliseconds=20))
    if i % 50 == 7:
        body = json.dumps(
            {"id": job_id, "kind": kind, "payload": {}, "created_at": start["created_at"]}
        ).encode()
        return ledger.poisoned(
            start, job_id, facts, "bad_input_data: a seeded failure", "bad_input_data", body
        )
    return ledger.completed(start, job_id, facts, 0, f"results/{job_id}.json", {"rows": 1}, 0.02)


def seed_jobs(
    rt: Runtime,
    putter: BlobPutter,
    records: int,
    days: int,
    log: Callable[[str], None],
    *,
    blobs_from: int = 0,
    ledger_blobs: int | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """`records` ledger records (blobs, as the app writes them: body, listing metadata, index
    tags) and their jobs index entities, newest `now`, spread over `days`. The index and the blobs
    are written by two lanes that do not wait for each other (Azurite's table process takes
    100 entities a request, its blob process one record); `blobs_from` skips the blobs of the
    newest records (written by an earlier run with the same `now`); `ledger_blobs` writes the
    blobs of the newest that many only (the pages read the ledger by id, never by listing)."""
    index = rt.job_index
    assert index is not None
    container = rt.settings.ledger_container
    now = now or utcnow()
    step = timedelta(seconds=days * 86400 / max(1, records))
    started = time.monotonic()
    tables: set[str] = set()
    done = {"index": 0, "blobs": blobs_from}
    finished: dict[str, float] = {}

    blob_end = records if ledger_blobs is None else min(records, ledger_blobs)

    def chunks(first: int, end: int) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        chunk: list[dict[str, Any]] = []
        table = ""
        for i in range(first, end):
            data = job_record(i, now - step * i)
            name = index.table_name(data["created_at"][:10].replace("-", ""))
            if chunk and (name != table or len(chunk) == 100):
                yield table, chunk
                chunk = []
            table = name
            chunk.append(data)
        if chunk:
            yield table, chunk

    def index_lane() -> None:
        lanes = Lanes(blob_threads=1)
        for table, chunk in chunks(0, records):
            if table not in tables:
                index.ensure_table(table)
                tables.add(table)
            client = index.service.get_table_client(table)
            entities = [job_entity(d) for d in chunk]
            lanes.table(lambda c=client, e=entities: submit_transaction(c, e))  # type: ignore[misc]
            done["index"] += len(chunk)
        lanes.wait()
        finished["index"] = time.monotonic() - started

    def put_blobs(items: list[dict[str, Any]]) -> None:
        for data in items:
            putter.put(container, f"{data['id']}.json", dump(data), listing_metadata(data), index_tags(data))
        with lock:
            done["blobs"] += len(items)

    lock = threading.Lock()

    def blob_lane() -> None:
        lanes = Lanes(table_threads=1)
        for _, chunk in chunks(blobs_from, blob_end):
            lanes.blob(lambda items=chunk: put_blobs(items))  # type: ignore[misc]
        lanes.wait()
        finished["blobs"] = time.monotonic() - started

    errors: list[BaseException] = []

    def run(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn,), daemon=True) for fn in (index_lane, blob_lane)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=30)
        elapsed = time.monotonic() - started
        log(
            f"  {elapsed:.0f} s: index {done['index']:,} of {records:,}, "
            f"ledger blobs {done['blobs']:,} of {blob_end:,} ({(done['blobs'] - blobs_from) / elapsed:.0f}/s)"
        )
        if errors:
            raise errors[0]
    return {
        "seconds": round(time.monotonic() - started, 1),
        "index_seconds": round(finished.get("index", 0.0), 1),
        "blob_seconds": round(finished.get("blobs", 0.0), 1),
        "tables": len(tables),
        "requests": math.ceil(records / 100),
        "blobs": blob_end,
        "blobs_from": blobs_from,
        "now": isoformat(now),
    }


def seed_archive(
    rt: Runtime, putter: BlobPutter, entries: int, with_blobs: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """`entries` listed archive index rows; the newest `with_blobs` also get their entry blob and a
    poisoned ledger record (what a replay reads). Returns the names with blobs, newest first."""
    index = rt.entry_index
    assert index is not None
    index.ensure()
    now = utcnow()
    started = time.monotonic()
    names: list[str] = []
    lanes = Lanes()
    archive, ledger_container = rt.settings.poison_archive_container, rt.settings.ledger_container

    def put_blobs(items: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> None:
        for name, entry, record in items:
            putter.put(archive, name, dump(entry))
            putter.put(
                ledger_container,
                f"{record['id']}.json",
                dump(record),
                listing_metadata(record),
                index_tags(record),
            )

    def make(i: int) -> tuple[str, dict[str, Any], dict[str, Any]]:
        job_id = f"poison-{i:06d}"
        at = now - timedelta(seconds=i)
        created = isoformat(at - timedelta(minutes=5))
        body = json.dumps({"id": job_id, "kind": "noop", "payload": {}, "created_at": created}).encode()
        start = {"id": job_id, "kind": "noop", "attempt": 4, "created_at": created}
        record = ledger.poisoned(start, job_id, Facts(at), "bad_input_data: seeded", "bad_input_data", body)
        entry = new_entry(
            body, job_id, True, "poisoned", "bad_input_data: seeded", now=at,
            queue_message_id=None, dequeue_count=5, record=record,
        )  # fmt: skip
        name = entry_name(job_id, entry["digest"])
        entry["index_key"] = entry_entity(name, entry)["RowKey"]
        return name, entry, record

    blob_errors: list[BaseException] = []

    def blob_lane() -> None:  # the newest entries' blobs, not waiting for the index rows
        try:
            batch: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
            for i in range(min(entries, with_blobs)):
                batch.append(make(i))
                names.append(batch[-1][0])
                if len(batch) == 50:
                    lanes.blob(lambda b=batch: put_blobs(b))  # type: ignore[misc]
                    batch = []
            if batch:
                lanes.blob(lambda b=batch: put_blobs(b))  # type: ignore[misc]
        except BaseException as exc:  # raised below
            blob_errors.append(exc)

    blobs_thread = threading.Thread(target=blob_lane, daemon=True)
    blobs_thread.start()
    rows: list[dict[str, Any]] = []
    shards: Counter[int] = Counter()  # the app's reason-code counters, shard by shard
    for i in range(entries):
        name, entry, _ = make(i)
        rows.append(entry_entity(name, entry))
        shards[shard_of(name)] += 1
        if len(rows) == 100:
            lanes.table(lambda r=rows: submit_transaction(index.table, r))  # type: ignore[misc]
            rows = []
        if (i + 1) % 20_000 == 0:
            log(f"  archive index: {i + 1:,} of {entries:,} ({time.monotonic() - started:.0f} s)")
    if rows:
        lanes.table(lambda r=rows: submit_transaction(index.table, r))  # type: ignore[misc]
    counters = [
        {"PartitionKey": COUNT_PARTITION, "RowKey": f"bad_input_data|{shard:02d}", "n": n}
        for shard, n in shards.items()
    ]
    lanes.table(lambda: submit_transaction(index.table, counters))
    blobs_thread.join()
    lanes.wait()
    if blob_errors:
        raise blob_errors[0]
    return {"seconds": round(time.monotonic() - started, 1), "blobs": len(names), "names": names}
