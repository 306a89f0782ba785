"""Seeding the console benchmark's Azurite fast: real ledger records and index entities, written
directly (not through the queue).

What it takes at a million jobs on the shared 2-core machine (figures in docs/operations.md):
- Azurite's three services as three processes (`azurite-blob`, `azurite-queue`, `azurite-table`,
  each `--inMemoryPersistence`): Azurite serves every request on one Node thread, so blob PUTs and
  table transactions in one process queue behind each other; apart they run on both cores. On
  disk is no option at this size: LokiJS saves a database as one JSON string (a million blob
  documents pass V8's 512 MiB string limit) and Azurite saves it every 5 s.
- Ledger records PUT over raw keep-alive `http.client` connections with Shared Key signing, from
  `BLOB_PROCESSES` spawned processes of `BLOB_THREADS` connections, each process building its own
  records (one Python process tops out below what Azurite's blob process answers).
- Index entities in entity group transactions of 100, the SDK's request body written here
  (the SDK spent ~0.4 ms of client CPU an entity serializing it; Azurite ~0.1 ms).
- The blob process with a V8 heap of half the memory (~5 KB of heap a blob) and
  `azurite_bench_patch.js` preloaded: LokiJS inserts at the end of an equal range of its
  shared-value indices (not O(n) a blob) and Azurite's blob GC passes are skipped (each sorts every
  blob once per 5,000: minutes at half a million); a Delete Blob finds its blob through the
  name's index and removes it without re-sorting every index (110 ms a delete at 30,000 blobs
  without the patch, 2 ms with it).
- The records are built by the ledger's own transitions (what the app writes and reads), the same
  for the index and the blobs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from email.utils import formatdate
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from devstack.azurite import AZURITE_BIN, dev_connection_string
from devstack.ports import free_port, wait_for_port
from shared import ledger
from shared.core.documents import dump
from shared.core.envelope import isoformat, utcnow
from shared.indexes.entry_rows import COUNT_PARTITION, EntryState, shard_of
from shared.indexes.entry_rows import entity_of as entry_entity
from shared.indexes.jobs import entity_of as job_entity
from shared.ledger import Facts
from shared.ledger.view import index_tags, listing_metadata
from shared.poison.entry import ArchiveEntry
from shared.runtime.wiring import Runtime

BLOB_PROCESSES = 2
"""Processes PUTting ledger blobs: one Python process (its GIL) sends ~1,000 PUTs/s at most."""
BLOB_THREADS = 8
"""Connections in flight per blob process."""
TABLE_THREADS = 2
"""Entity group transactions in flight."""
CHUNK = 5_000
"""Jobs a blob process takes at a time (the progress line moves by these)."""
API_VERSION = "2021-08-06"
TABLE_API_VERSION = "2019-02-02"
PROGRESS_S = 30.0
AZURITE_PATCH = Path(__file__).resolve().with_name("azurite_bench_patch.js")
"""Preloaded into the blob process: LokiJS's index insert at the end of an equal range (not O(n)
a blob), and no blob GC passes (each a sort of every blob per 5,000): see the file."""


# -- Azurite, one process per service ----------------------------------------------------------


def blob_heap_mb() -> int:
    """The blob process's V8 heap limit: Azurite keeps every blob's metadata in its heap (about
    5.5 KB a blob), past Node's default (~4 GB) at a million blobs; half the machine's memory."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return max(4096, total // 2)


@dataclass
class SplitAzurite:
    """Azurite's blob, queue and table services as three in-memory processes on free ports."""

    blob_port: int = field(default_factory=free_port)
    queue_port: int = field(default_factory=free_port)
    table_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def connection_string(self) -> str:
        return dev_connection_string(self.blob_port, self.queue_port, self.table_port)

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
            env = dict(os.environ)
            if service == "blob":
                env["NODE_OPTIONS"] = (
                    f"{env.get('NODE_OPTIONS', '')} --max-old-space-size={blob_heap_mb()} --require {AZURITE_PATCH}"
                )
            self.processes.append(
                subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
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


# -- raw signed requests ----------------------------------------------------------------------


class _Signed:
    """Keep-alive `http.client` connections (one per thread) to one endpoint of a connection
    string, Shared Key signed; the SDK's pipeline costs more client CPU per request than
    Azurite's answer."""

    def __init__(self, connection_string: str, endpoint: str) -> None:
        parts = dict(p.split("=", 1) for p in connection_string.split(";") if "=" in p)
        url = urlsplit(parts[endpoint])
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
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        return conn

    def _signature(self, text: str) -> str:
        return base64.b64encode(hmac.new(self.key, text.encode(), hashlib.sha256).digest()).decode()

    def send(
        self,
        method: str,
        path: str,
        body: bytes,
        sign: Callable[[dict[str, str]], dict[str, str]],
        ok: int,
        tries: int = 6,
    ) -> bytes:
        """Send until answered `ok`: a kept-alive connection the server closed, or a 5xx, is tried
        again (every request sent here is idempotent: a PUT of a whole blob, an upsert)."""
        for attempt in range(tries):
            headers = sign({"x-ms-date": formatdate(usegmt=True)})
            try:
                conn = self._conn()
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                answer = resp.read()
            except (OSError, http.client.HTTPException):
                self._local.conn = None
                time.sleep(0.2 * attempt)
                continue
            with self._lock:
                self.requests += 1
            if resp.status == ok:
                return answer
            if resp.status < 500 or attempt == tries - 1:
                raise RuntimeError(f"{method} {path}: {resp.status} {answer[:300]!r}")
            time.sleep(0.5 * attempt)
        raise RuntimeError(f"{method} {path}: no answer after {tries} tries")


class BlobPutter(_Signed):
    """Put Blob, with the metadata and index tags the app's write sets."""

    def __init__(self, connection_string: str) -> None:
        super().__init__(connection_string, "BlobEndpoint")

    def put(
        self,
        container: str,
        name: str,
        body: bytes,
        metadata: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        path = f"{self.prefix}/{container}/{quote(name)}"
        fixed = {"x-ms-blob-type": "BlockBlob", "x-ms-version": API_VERSION}
        for key, value in (metadata or {}).items():
            fixed[f"x-ms-meta-{key}"] = value
        if tags:
            fixed["x-ms-tags"] = urlencode(tags, quote_via=quote)

        def sign(dated: dict[str, str]) -> dict[str, str]:
            headers = {**fixed, **dated}
            canonical = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
            text = f"PUT\n\n\n{len(body)}\n\napplication/json\n\n\n\n\n\n\n{canonical}/{self.account}{path}"
            return {
                **headers,
                "Content-Type": "application/json",
                "Content-Length": str(len(body)),
                "Authorization": f"SharedKey {self.account}:{self._signature(text)}",
            }

        self.send("PUT", path, body, sign, 201)


_FAILED_PART = re.compile(rb"HTTP/1\.1 [45]\d\d[^\r\n]*")


class TableBatcher(_Signed):
    """Entity group transactions of upserts (merge, as the SDK's `upsert`), the body the SDK
    sends: one request per 100 entities of one partition of one table."""

    def __init__(self, connection_string: str) -> None:
        super().__init__(connection_string, "TableEndpoint")
        self.base = f"http://{self.host}:{self.port}{self.prefix}"

    def upsert(self, table: str, entities: list[dict[str, Any]]) -> None:
        batch, changeset = f"batch_{uuid.uuid4()}", f"changeset_{uuid.uuid4()}"
        parts = [f"--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n"]
        for n, entity in enumerate(entities):
            keys = ",".join(
                f"{k}='{quote(str(entity[k]).replace(chr(39), chr(39) * 2), safe='')}'"
                for k in ("PartitionKey", "RowKey")
            )
            data = json.dumps(odata(entity))
            parts.append(
                f"--{changeset}\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n"
                f"Content-ID: {n}\r\n\r\nPATCH {self.base}/{table}({keys}) HTTP/1.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data.encode())}\r\n"
                f"x-ms-version: {TABLE_API_VERSION}\r\nDataServiceVersion: 3.0\r\n"
                f"Accept: application/json\r\n\r\n{data}\r\n"
            )
        parts.append(f"--{changeset}--\r\n\r\n--{batch}--\r\n")
        body = "".join(parts).encode()
        path = f"{self.prefix}/$batch"
        content_type = f"multipart/mixed; boundary={batch}"

        def sign(dated: dict[str, str]) -> dict[str, str]:
            text = f"POST\n\n{content_type}\n{dated['x-ms-date']}\n/{self.account}{path}"
            return {
                **dated,
                "x-ms-version": TABLE_API_VERSION,
                "DataServiceVersion": "3.0",
                "MaxDataServiceVersion": "3.0;NetFx",
                "Accept": "application/json",
                "Content-Type": content_type,
                "Content-Length": str(len(body)),
                "Authorization": f"SharedKey {self.account}:{self._signature(text)}",
            }

        answer = self.send("POST", path, body, sign, 202)
        failed = _FAILED_PART.search(answer)  # the batch is answered 202 whatever its parts did
        if failed:
            raise RuntimeError(f"transaction on {table}: {failed.group().decode()} {answer[:400]!r}")


def odata(entity: dict[str, Any]) -> dict[str, Any]:
    """An entity's JSON as the SDK writes it: strings and 64-bit integers typed."""
    out: dict[str, Any] = {}
    for key, value in entity.items():
        if isinstance(value, str):
            out[key], out[f"{key}@odata.type"] = value, "Edm.String"
        elif isinstance(value, bool) or (isinstance(value, int) and -(2**31) <= value < 2**31):
            out[key] = value
        elif isinstance(value, int):
            out[key], out[f"{key}@odata.type"] = str(value), "Edm.Int64"
        elif isinstance(value, float):
            out[key], out[f"{key}@odata.type"] = value, "Edm.Double"
        else:
            raise TypeError(f"{key}: {type(value).__name__} is not seeded")
    return out


# -- work in other processes, with progress ---------------------------------------------------


def _threaded(count: int, threads: int, fn: Callable[[int], None]) -> None:
    """fn(0) ... fn(count - 1) on `threads` threads; the first error is raised."""
    it = iter(range(count))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run() -> None:
        while not errors:
            with lock:
                i = next(it, None)
            if i is None:
                return
            try:
                fn(i)
            except BaseException as exc:  # raised below
                errors.append(exc)

    pool = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


class Progress:
    """A line every `PROGRESS_S`: done of total, rate over the last interval and overall, ETA."""

    def __init__(self, what: str, total: int, log: Callable[[str], None], done: int = 0) -> None:
        self.what, self.total, self.log = what, total, log
        self.started = self.last_at = time.monotonic()
        self.first = self.last = done
        self.ended = False

    def show(self, done: int, extra: str = "") -> None:
        now = time.monotonic()
        if now - self.last_at < PROGRESS_S and (done < self.total or self.ended):
            return
        self.ended = done >= self.total
        rate = (done - self.last) / max(1e-9, now - self.last_at)
        overall = (done - self.first) / max(1e-9, now - self.started)
        eta = (self.total - done) / overall if overall else float("inf")
        self.log(
            f"  {now - self.started:5.0f} s: {self.what} {done:,} of {self.total:,} "
            f"({rate:.0f}/s now, {overall:.0f}/s overall, ETA {eta:.0f} s){extra}"
        )
        self.last_at, self.last = now, done


@contextmanager
def _pool(processes: int) -> Iterator[ProcessPoolExecutor]:
    """Spawned worker processes; on an error or a stop (SIGTERM) they are ended, not waited for."""
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))
    try:
        yield pool
    except BaseException:
        workers = list(getattr(pool, "_processes", None) or {})
        pool.shutdown(wait=False, cancel_futures=True)
        for pid in workers:  # the pool's own processes, by PID
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        raise
    pool.shutdown()


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


def _job_blobs(
    conn: str, container: str, first: int, end: int, now: datetime, step: timedelta, threads: int
) -> int:
    """(In a blob process.) The ledger blobs of jobs `first` .. `end` - 1, as the app writes them:
    body, listing metadata, index tags."""
    putter = BlobPutter(conn)

    def put(k: int) -> None:
        data = job_record(first + k, now - step * (first + k))
        putter.put(container, f"{data['id']}.json", dump(data), listing_metadata(data), index_tags(data))

    _threaded(end - first, threads, put)
    return end - first


def seed_jobs(
    rt: Runtime,
    conn: str,
    records: int,
    days: int,
    log: Callable[[str], None],
    *,
    blobs_from: int = 0,
    ledger_blobs: int | None = None,
    now: datetime | None = None,
    processes: int = BLOB_PROCESSES,
    threads: int = BLOB_THREADS,
) -> dict[str, Any]:
    """`records` ledger records (blobs, as the app writes them: body, listing metadata, index
    tags) and their jobs index entities, newest `now`, spread over `days`. The blobs are PUT by
    `processes` processes (each building its own records, the same as the index's), while this
    one writes the index entities 100 a transaction; `blobs_from` skips the blobs of the newest
    records (written by an earlier run with the same `now`); `ledger_blobs` writes the blobs of
    the newest that many only (the pages read the ledger by id, never by listing)."""
    index = rt.job_index
    assert index is not None
    container = rt.settings.ledger_container
    now = now or utcnow()
    step = timedelta(seconds=days * 86400 / max(1, records))
    started = time.monotonic()
    tables: set[str] = set()
    done = {"index": 0}
    finished: dict[str, float] = {}
    blob_end = records if ledger_blobs is None else min(records, ledger_blobs)

    def chunks() -> Iterator[tuple[str, list[dict[str, Any]]]]:
        chunk: list[dict[str, Any]] = []
        table = ""
        for i in range(records):
            data = job_record(i, now - step * i)
            name = index.table_name(data["created_at"][:10].replace("-", ""))
            if chunk and (name != table or len(chunk) == 100):
                yield table, chunk
                chunk = []
            table = name
            chunk.append(data)
        if chunk:
            yield table, chunk

    batcher = TableBatcher(conn)

    def index_lane() -> None:
        it = chunks()
        lock = threading.Lock()

        def send(_: int) -> None:
            while True:
                with lock:
                    got = next(it, None)
                    if got is None:
                        return
                    table, chunk = got
                    if table not in tables:
                        index.ensure_table(table)
                        tables.add(table)
                    entities = [job_entity(d) for d in chunk]
                batcher.upsert(table, entities)
                with lock:
                    done["index"] += len(chunk)

        _threaded(TABLE_THREADS, TABLE_THREADS, send)
        finished["index"] = time.monotonic() - started

    errors: list[BaseException] = []

    def lane() -> None:
        try:
            index_lane()
        except BaseException as exc:  # raised below
            errors.append(exc)

    index_thread = threading.Thread(target=lane, daemon=True)
    index_thread.start()
    blobs = blobs_from
    progress = Progress("ledger blobs", blob_end, log, done=blobs_from)
    with _pool(processes) as pool:
        pending = {
            pool.submit(_job_blobs, conn, container, a, min(a + CHUNK, blob_end), now, step, threads)
            for a in range(blobs_from, blob_end, CHUNK)
        }
        while pending or index_thread.is_alive():
            finished_now, pending = wait(pending, timeout=5, return_when=FIRST_COMPLETED)
            if not pending and not finished_now:
                index_thread.join(timeout=5)
            for future in finished_now:
                blobs += future.result()
            if not pending:
                finished.setdefault("blobs", time.monotonic() - started)
            if errors:
                raise errors[0]
            progress.show(blobs, f"; index {done['index']:,} of {records:,}")
    return {
        "seconds": round(time.monotonic() - started, 1),
        "index_seconds": round(finished.get("index", 0.0), 1),
        "blob_seconds": round(finished.get("blobs", 0.0), 1),
        "tables": len(tables),
        "requests": math.ceil(records / 100),
        "blobs": blob_end,
        "blobs_from": blobs_from,
        "blobs_per_s": round((blob_end - blobs_from) / max(1e-9, finished["blobs"]), 1),
        "index_per_s": round(records / max(1e-9, finished.get("index", 0.0)), 1),
        "processes": processes,
        "threads": threads,
        "now": isoformat(now),
    }


def archive_item(i: int, now: datetime) -> tuple[str, ArchiveEntry, dict[str, Any]]:
    """Archive entry `i` (newest first from `now`): its name, entry and poisoned ledger record."""
    job_id = f"poison-{i:06d}"
    at = now - timedelta(seconds=i)
    created = isoformat(at - timedelta(minutes=5))
    body = json.dumps({"id": job_id, "kind": "noop", "payload": {}, "created_at": created}).encode()
    start = {"id": job_id, "kind": "noop", "attempt": 4, "created_at": created}
    record = ledger.poisoned(start, job_id, Facts(at), "bad_input_data: seeded", "bad_input_data", body)
    entry = ArchiveEntry.new(
        body, job_id, True, EntryState.POISONED, "bad_input_data: seeded", now=at,
        queue_message_id=None, dequeue_count=5, record=record,
    )  # fmt: skip
    name = entry.name
    return name, replace(entry, index_key=entry.key(name)), record


def _archive_blobs(
    conn: str, archive: str, ledger_container: str, first: int, end: int, now: datetime, threads: int
) -> int:
    """(In a blob process.) Entry blobs and poisoned ledger records of entries `first` .. `end` - 1."""
    putter = BlobPutter(conn)

    def put(k: int) -> None:
        name, entry, record = archive_item(first + k, now)
        putter.put(archive, name, dump(entry.to_data()))
        putter.put(
            ledger_container,
            f"{record['id']}.json",
            dump(record),
            listing_metadata(record),
            index_tags(record),
        )

    _threaded(end - first, threads, put)
    return end - first


def seed_archive(
    rt: Runtime,
    conn: str,
    entries: int,
    with_blobs: int,
    log: Callable[[str], None],
    *,
    processes: int = BLOB_PROCESSES,
    threads: int = BLOB_THREADS,
) -> dict[str, Any]:
    """`entries` listed archive index rows (and the counts per reason code, as the app keeps
    them); the newest `with_blobs` also get their entry blob and a poisoned ledger record (what a
    replay reads). Returns the names with blobs, newest first."""
    index = rt.entry_index
    assert index is not None
    index.ensure()
    now = utcnow()
    started = time.monotonic()
    batcher = TableBatcher(conn)
    with_blobs = min(entries, with_blobs)
    with _pool(processes) as pool:
        blob_jobs = [
            pool.submit(
                _archive_blobs,
                conn,
                rt.settings.poison_archive_container,
                rt.settings.ledger_container,
                a,
                min(a + 1000, with_blobs),
                now,
                threads,
            )
            for a in range(0, with_blobs, 1000)
        ]
        names: list[str] = []
        shards: Counter[int] = Counter()  # the app's reason-code counters, shard by shard
        progress = Progress("archive index rows", entries, log)
        lock = threading.Lock()
        it = iter(range(entries))
        sent = {"rows": 0}

        def send(_: int) -> None:
            while True:
                chunk: list[dict[str, Any]] = []
                with lock:
                    for i in it:
                        name, entry, _record = archive_item(i, now)
                        if i < with_blobs:
                            names.append(name)
                        shards[shard_of(name)] += 1
                        chunk.append(entry_entity(entry.row(name)))
                        if len(chunk) == 100:
                            break
                if not chunk:
                    return
                batcher.upsert(index.name, chunk)
                with lock:
                    sent["rows"] += len(chunk)
                    progress.show(sent["rows"])

        _threaded(TABLE_THREADS, TABLE_THREADS, send)
        counters = [
            {"PartitionKey": COUNT_PARTITION, "RowKey": f"bad_input_data|{shard:02d}", "n": n}
            for shard, n in sorted(shards.items())
        ]
        batcher.upsert(index.name, counters)
        blobs = sum(f.result() for f in blob_jobs)
    return {"seconds": round(time.monotonic() - started, 1), "blobs": blobs, "names": names}
