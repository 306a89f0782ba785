"""Benchmarks of the local Functions host (devhost) on a real Azurite.

Four measurements, each on its own Azurite started and stopped here:

- `throughput`: the host against a bare receive(32)/delete loop on the same Azurite, in the same
  run, alternately (bare, host, bare, host, ...), medians. Both drain N pre-filled `noop` jobs; then
  again with a shallower queue, because Azurite's queue calls get slower as the queue gets deeper
  (the bare loop makes only queue calls; two thirds of the host's calls are ledger blob writes).
  CPU seconds of the consumer, of Azurite and of the whole machine are recorded for each drain.
- `requests_per_message`: storage requests per message on the happy, duplicate and retry paths,
  counted by the host itself (`--count-requests`), idle polling subtracted.
- `latency`: enqueue-to-completion p50 / p95 under a steady producer.
- `scaling`: time to drain N jobs with 1, 2, 3 host processes competing for the queue.

A host is "released" onto a pre-filled queue: it is started and warmed up on an empty queue, paused
(SIGSTOP) while the queue is filled, then resumed (SIGCONT), so that neither its start-up nor its
first-call set-up is timed or counted. Host logs go to the given log folder.

    python -m bench.bench_host [--messages N] [--quick]   # all four, JSON on stdout
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from azure.core.exceptions import ResourceExistsError
from azure.storage.queue import QueueClient, TextBase64EncodePolicy

from devhost.config import parse_duration
from devstack.azurite import Azurite, start_azurite
from devstack.hostproc import REPO_ROOT, HostProcess, host_env, init_storage

LEASE_S = 600  # the host receives with a 10-minute visibility; the bare loop does the same
BENCH_QUEUES = {  # host.json `extensions.queues` of the bench app dir (the rest as shipped)
    "batchSize": 32,
    "newBatchThreshold": 16,
}
PREFILL_THREADS = 8


# --- small helpers ------------------------------------------------------------------------------


def isoformat(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def envelope(job_id: str, kind: str = "noop", payload: dict[str, Any] | None = None) -> str:
    """The JSON text of a job envelope (the queue client's base64 policy encodes it)."""
    body = {
        "id": job_id,
        "kind": kind,
        "payload": payload if payload is not None else {},
        "attempt": 0,
        "created_at": isoformat(datetime.now(UTC)),
    }
    return json.dumps(body, separators=(",", ":"))


def queue_client(conn: str, name: str) -> QueueClient:
    """A queue client that base64-encodes what it sends (host.json messageEncoding: base64)."""
    return QueueClient.from_connection_string(conn, name, message_encode_policy=TextBase64EncodePolicy())


def prefill(conn: str, queue: str, texts: Sequence[str]) -> float:
    """Put the messages on the queue with a few threads; returns the seconds it took."""
    client = queue_client(conn, queue)
    start = time.perf_counter()
    with ThreadPoolExecutor(PREFILL_THREADS) as pool:
        list(pool.map(client.send_message, texts))
    return time.perf_counter() - start


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return float(ordered[rank - 1])


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (all its threads): /proc on Linux; this process if None."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_ticks() -> tuple[int, int]:
    """(all, idle) CPU ticks of the whole machine since boot (/proc/stat); (0, 0) elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            values = [int(v) for v in fh.readline().split()[1:]]
        return sum(values), values[3] + values[4]
    except (OSError, IndexError, ValueError):
        return 0, 0


@dataclass
class CpuUse:
    """CPU seconds during one measurement: the consumer(s), Azurite, and the whole machine."""

    consumer_s: float = 0.0
    azurite_s: float = 0.0
    machine_busy_cores: float = 0.0  # cores busy on the whole machine, all processes (0..cpu count)


class CpuMeter:
    """CPU seconds used by the consumer process(es) and by Azurite between start() and stop()."""

    def __init__(self, consumer_pids: Sequence[int | None], azurite: Azurite) -> None:
        self.consumers = list(consumer_pids)
        self.azurite_pid = azurite.process.pid if azurite.process else -1
        self._start = (0.0, 0.0, (0, 0))

    def _now(self) -> tuple[float, float, tuple[int, int]]:
        return sum(cpu_seconds(p) for p in self.consumers), cpu_seconds(self.azurite_pid), machine_ticks()

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> CpuUse:
        consumer, azurite, (total, idle) = self._now()
        d_total, d_idle = total - self._start[2][0], idle - self._start[2][1]
        busy = (d_total - d_idle) / d_total * (os.cpu_count() or 1) if d_total > 0 else 0.0
        return CpuUse(consumer - self._start[0], azurite - self._start[1], busy)


def child_pids(parent: int) -> list[int]:
    """Processes whose parent is `parent` (/proc on Linux; [] elsewhere)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text(encoding="ascii").rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(stat.parent.name))
    return found


def host_pids(hosts: Sequence[HostProcess]) -> list[int | None]:
    """The host processes and their worker processes (the function app runs in the worker)."""
    pids = [h.process.pid for h in hosts if h.process is not None]
    return [*pids, *(child for pid in pids for child in child_pids(pid))]


def make_app_dir(root: Path, queues: dict[str, Any]) -> Path:
    """The same app with another host.json (as tests/integration/test_e2e_host.py does)."""
    target = root / "app"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("function_app.py", "shared"):
        link = target / name
        if not link.exists():
            os.symlink(REPO_ROOT / name, link)
    host = json.loads((REPO_ROOT / "host.json").read_text(encoding="utf-8"))
    host["extensions"]["queues"].update(queues)
    (target / "host.json").write_text(json.dumps(host, indent=2), encoding="utf-8")
    return target


def shipped_queue_options() -> dict[str, Any]:
    return dict(json.loads((REPO_ROOT / "host.json").read_text(encoding="utf-8"))["extensions"]["queues"])


# A paused host may have been in a polling backoff wait of up to maxPollingInterval; pausing longer
# than that makes it poll as soon as it is resumed, so that the drain clock starts on time.
RELEASE_AFTER_S = parse_duration(shipped_queue_options().get("maxPollingInterval", "00:01:00")) + 0.5


# --- the stack: Azurite, settings, hosts --------------------------------------------------------


@dataclass
class Site:
    """One Azurite with one set of app names (queue and containers) and its host environment."""

    azurite: Azurite
    tag: str
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def conn(self) -> str:
        return self.azurite.connection_string

    @property
    def queue(self) -> str:
        return self.env["JOBS_QUEUE"]

    def init(self, **settings: str) -> Site:
        """Settings for this tag, and the queues and containers created by `shared.interfaces.cli init`."""
        names = {
            "JOBS_QUEUE": f"{self.tag}-jobs",
            "LEDGER_CONTAINER": f"{self.tag}-ledger",
            "RESULTS_CONTAINER": f"{self.tag}-results",
            "PAYLOADS_CONTAINER": f"{self.tag}-payloads",
            "POISON_ARCHIVE_CONTAINER": f"{self.tag}-archive",
            "ENABLE_TEST_KINDS": "1",
            "RETRY_BASE_SECONDS": "1",
            **settings,
        }
        self.env = host_env(self.conn, names)
        init_storage(self.env)
        return self

    def start_hosts(self, count: int, app_dir: Path | None) -> list[HostProcess]:
        """Start `count` devhost processes on this site's queue and warm each one up."""
        extra = ["--app-dir", str(app_dir)] if app_dir else []
        hosts = []
        try:
            for i in range(count):
                name = f"{self.tag}-host{i + 1}"
                host = HostProcess(
                    self.env, instance_id=name, log_path=self.log_dir / f"{name}.log", extra_args=extra
                )
                hosts.append(host.start())
            for host in hosts:
                warm_up(host)
        except BaseException:
            stop_hosts(hosts)
            raise
        return hosts


@contextlib.contextmanager
def azurite_site(log_dir: Path, name: str) -> Iterator[Azurite]:
    """A fresh Azurite (temporary data folder) for one measurement."""
    log_dir.mkdir(parents=True, exist_ok=True)
    azurite = start_azurite(log_path=log_dir / f"azurite-{name}.log")
    try:
        yield azurite
    finally:
        azurite.cleanup()


def warm_up(host: HostProcess) -> None:
    """GET /api/health builds the app's runtime (clients, settings) before anything is timed."""
    with urllib.request.urlopen(f"{host.url}/api/health", timeout=30) as resp:
        resp.read()


def stop_hosts(hosts: Sequence[HostProcess]) -> None:
    for host in hosts:
        resume([host])  # a stopped process cannot act on SIGTERM
        host.stop()


def pause(hosts: Sequence[HostProcess]) -> None:
    for host in hosts:
        if host.process is not None and host.process.poll() is None:
            os.kill(host.process.pid, signal.SIGSTOP)


def resume(hosts: Sequence[HostProcess]) -> None:
    for host in hosts:
        if host.process is not None and host.process.poll() is None:
            os.kill(host.process.pid, signal.SIGCONT)


@contextlib.contextmanager
def paused(hosts: Sequence[HostProcess], at_least_s: float = 0.0) -> Iterator[None]:
    """Hosts stopped (SIGSTOP) inside the block, for `at_least_s` seconds or more."""
    pause(hosts)
    until = time.monotonic() + at_least_s
    try:
        yield
        time.sleep(max(0.0, until - time.monotonic()))
    finally:
        resume(hosts)


# --- reading the host's counters ----------------------------------------------------------------


@dataclass
class Usage:
    """What one or more hosts did between two stats snapshots (counter deltas)."""

    requests: int = 0
    by_method: dict[str, int] = field(default_factory=dict)  # "queue GET" -> n
    queue: dict[str, int] = field(default_factory=dict)  # the jobs queue's counters
    idle_requests: int = 0  # empty polls (all queues), failed polls, timer runs (poison sweep peeks)
    poison_received: int = 0  # messages received from <queue>-poison (none in a clean run)

    @property
    def busy_receives(self) -> int:
        q = self.queue
        return q.get("polls", 0) - q.get("empty_polls", 0) - q.get("poll_errors", 0)

    @property
    def work_requests(self) -> int:
        return self.requests - self.idle_requests


def _flat(stats: dict[str, Any], queue: str) -> dict[str, int]:
    out: dict[str, int] = {}
    requests = stats.get("storage_requests") or {}
    out["requests"] = int(requests.get("total", 0))
    for service, per in requests.items():
        if isinstance(per, dict):
            for method, n in per.items():
                if method != "total":
                    out[f"{service} {method}"] = int(n)
    idle = 0
    for name, counters in (stats.get("queues") or {}).items():
        idle += int(counters.get("empty_polls", 0)) + int(counters.get("poll_errors", 0))
        if name == queue:
            for key, value in counters.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    out[f"q.{key}"] = value
        elif name == f"{queue}-poison":
            out["poison_received"] = int(counters.get("received", 0))
    idle += sum(int(t.get("runs", 0)) for t in (stats.get("timers") or {}).values())
    out["idle"] = idle
    return out


def snapshot(hosts: Sequence[HostProcess], queue: str) -> dict[str, int]:
    """Summed counters of the hosts (storage requests by service and method, queue counters)."""
    total: dict[str, int] = {}
    for host in hosts:
        for key, value in _flat(host.stats(), queue).items():
            total[key] = total.get(key, 0) + value
    return total


def usage(before: dict[str, int], after: dict[str, int]) -> Usage:
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
    return Usage(
        requests=delta.pop("requests", 0),
        idle_requests=delta.pop("idle", 0),
        poison_received=delta.pop("poison_received", 0),
        queue={k[2:]: v for k, v in delta.items() if k.startswith("q.")},
        by_method={k: v for k, v in sorted(delta.items()) if not k.startswith("q.") and v},
    )


def wait_for(
    hosts: Sequence[HostProcess], queue: str, counter: str, target: int, timeout_s: float, every: float = 0.1
) -> dict[str, int]:
    """Poll the hosts' stats until the summed queue `counter` reaches `target` and nothing is in flight."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap = snapshot(hosts, queue)
        if snap.get(f"q.{counter}", 0) >= target and snap.get("q.in_flight", 0) == 0:
            return snap
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{counter} = {snap.get(f'q.{counter}', 0)} of {target} after {timeout_s:.0f}s"
            )
        time.sleep(every)


# --- 1. throughput: the host against a bare loop ------------------------------------------------


@dataclass
class Drain:
    """One consumer draining a pre-filled queue."""

    consumer: str
    messages: int
    seconds: float
    requests: int
    prefill_s: float = 0.0
    consumer_cpu_s: float = 0.0  # CPU seconds of the consumer process(es) during the drain
    azurite_cpu_s: float = 0.0  # CPU seconds of Azurite (one Node process) during the drain
    machine_busy_cores: float = 0.0  # all processes on the machine (others' work included)

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "seconds": round(self.seconds, 3),
            "prefill_s": round(self.prefill_s, 3),
            "messages_per_s": round(self.messages_per_s, 1),
            "requests_per_s": round(self.requests_per_s, 1),
            "requests_per_message": round(self.requests / self.messages, 3),
            "consumer_cpu_s": round(self.consumer_cpu_s, 2),
            "azurite_cpu_s": round(self.azurite_cpu_s, 2),
            "consumer_cores": round(self.consumer_cpu_s / self.seconds, 2),
            "azurite_cores": round(self.azurite_cpu_s / self.seconds, 2),
            "machine_busy_cores": round(self.machine_busy_cores, 2),
            "other_cores": round(
                max(0.0, self.machine_busy_cores - (self.consumer_cpu_s + self.azurite_cpu_s) / self.seconds),
                2,
            ),
        }


def bare_drain(conn: str, queue: str, count: int, batch: int, threshold: int, meter: CpuMeter) -> Drain:
    """Receive(batch)/delete until `count` messages are deleted: one receiving thread, deletes on a
    pool of batch + threshold threads, a new receive once in-flight <= threshold (as the host)."""
    client = QueueClient.from_connection_string(conn, queue)  # raw text: nothing to decode
    cond = threading.Condition()
    in_flight = deleted = requests = 0

    def delete(message: Any) -> None:
        nonlocal in_flight, deleted, requests
        done = False
        try:
            client.delete_message(message.id, message.pop_receipt)
            done = True
        finally:  # a failed delete still leaves the in-flight count (and shows in `deleted`)
            with cond:
                in_flight -= 1
                deleted += done
                requests += 1
                cond.notify_all()

    def room() -> bool:
        return in_flight <= threshold

    def idle() -> bool:
        return in_flight == 0

    taken = 0
    meter.start()
    start = time.perf_counter()
    with ThreadPoolExecutor(batch + threshold) as pool:
        while taken < count:
            with cond:
                cond.wait_for(room)
            pages = client.receive_messages(
                messages_per_page=batch, max_messages=batch, visibility_timeout=LEASE_S
            ).by_page()
            batch_messages = list(next(pages, []))
            with cond:
                requests += 1
            if not batch_messages:
                time.sleep(0.05)
                continue
            for message in batch_messages:
                with cond:
                    in_flight += 1
                taken += 1
                pool.submit(delete, message)
        with cond:
            cond.wait_for(idle)
    elapsed = time.perf_counter() - start
    cpu = meter.stop()
    if deleted != count:
        raise RuntimeError(f"bare loop deleted {deleted} of {count}")
    return Drain("bare", count, elapsed, requests, 0.0, cpu.consumer_s, cpu.azurite_s, cpu.machine_busy_cores)


def host_drain(site: Site, hosts: Sequence[HostProcess], count: int, label: str, timeout_s: float) -> Drain:
    """Pause the hosts, pre-fill `count` new noop jobs, resume them and time the drain."""
    before = snapshot(hosts, site.queue)
    texts = [envelope(f"{label}-{i:06d}") for i in range(count)]
    meter = CpuMeter(host_pids(hosts), site.azurite)
    with paused(hosts, RELEASE_AFTER_S):
        prefill_s = prefill(site.conn, site.queue, texts)
    meter.start()
    start = time.perf_counter()
    after = wait_for(hosts, site.queue, "deletes", before.get("q.deletes", 0) + count, timeout_s)
    elapsed = time.perf_counter() - start
    cpu = meter.stop()
    used = usage(before, after)
    check_clean(used, count)
    name = "host" if len(hosts) == 1 else f"{len(hosts)} hosts"
    return Drain(
        name, count, elapsed, used.requests, prefill_s, cpu.consumer_s, cpu.azurite_s, cpu.machine_busy_cores
    )


def check_clean(used: Usage, deliveries: int) -> None:
    """The jobs must have run as meant: no failure, nothing sent to the poison queue."""
    bad = {k: used.queue.get(k, 0) for k in ("failures", "poison_moves", "storage_errors", "timeouts")}
    bad["poison_queue_received"] = used.poison_received
    if any(bad.values()) or used.queue.get("deletes", 0) < deliveries:
        raise RuntimeError(f"the bench jobs did not run cleanly: {bad}, deletes {used.queue.get('deletes')}")


def summarize(runs: Sequence[Drain]) -> dict[str, float]:
    """Medians over drains of one consumer."""
    return {
        "messages_per_s": round(median([d.messages_per_s for d in runs]), 1),
        "requests_per_s": round(median([d.requests_per_s for d in runs]), 1),
        "requests_per_message": round(median([d.requests / d.messages for d in runs]), 3),
        "consumer_cores": round(median([d.consumer_cpu_s / d.seconds for d in runs]), 2),
        "azurite_cores": round(median([d.azurite_cpu_s / d.seconds for d in runs]), 2),
        "machine_busy_cores": round(median([d.machine_busy_cores for d in runs]), 2),
        "consumer_cpu_ms_per_message": round(median([1000 * d.consumer_cpu_s / d.messages for d in runs]), 2),
        "azurite_cpu_ms_per_message": round(median([1000 * d.azurite_cpu_s / d.messages for d in runs]), 2),
        "azurite_cpu_ms_per_request": round(median([1000 * d.azurite_cpu_s / d.requests for d in runs]), 2),
    }


def compare(
    site: Site, hosts: Sequence[HostProcess], count: int, rounds: int, timeout_s: float
) -> dict[str, Any]:
    """`rounds` x (bare loop, host), each draining `count` pre-filled jobs; medians and ratios."""
    batch, threshold = BENCH_QUEUES["batchSize"], BENCH_QUEUES["newBatchThreshold"]
    bare_queue = f"{site.tag}-bare"
    with contextlib.suppress(ResourceExistsError):
        queue_client(site.conn, bare_queue).create_queue()
    runs: list[Drain] = []
    for r in range(rounds):
        with paused(hosts):  # Azurite serves the bare loop alone
            texts = [envelope(f"bare{count}r{r}-{i:06d}") for i in range(count)]
            prefill_s = prefill(site.conn, bare_queue, texts)
            bare = bare_drain(site.conn, bare_queue, count, batch, threshold, CpuMeter([None], site.azurite))
            bare.prefill_s = prefill_s
        runs.append(bare)
        host = host_drain(site, hosts, count, f"host{count}r{r}", timeout_s)
        runs.append(host)
        _progress(
            f"  {count} jobs, round {r + 1}: bare {bare.messages_per_s:6.1f} msg/s {bare.requests_per_s:6.1f} req/s;"
            f" host {host.messages_per_s:6.1f} msg/s {host.requests_per_s:6.1f} req/s"
        )
    summary = {
        "bare": summarize([d for d in runs if d.consumer == "bare"]),
        "host": summarize([d for d in runs if d.consumer == "host"]),
    }
    pairs = list(zip(runs[::2], runs[1::2], strict=True))  # (bare, host) of the same round
    return {
        "messages": count,
        "rounds": rounds,
        "runs": [d.to_dict() for d in runs],
        "median": summary,
        "request_rate_ratio": round(summary["host"]["requests_per_s"] / summary["bare"]["requests_per_s"], 3),
        "message_rate_ratio": round(summary["host"]["messages_per_s"] / summary["bare"]["messages_per_s"], 3),
        "request_rate_ratio_by_round": [round(h.requests_per_s / b.requests_per_s, 3) for b, h in pairs],
        "request_rate_ratio_paired_median": round(
            median([h.requests_per_s / b.requests_per_s for b, h in pairs]), 3
        ),
    }


def throughput(
    log_dir: Path, app_dir: Path, counts: Sequence[int], rounds: int, timeout_s: float
) -> dict[str, Any]:
    """Bare loop and host alternately on one Azurite and one warm host process, for each queue
    depth in `counts` (the first is the headline); medians of each."""
    batch, threshold = BENCH_QUEUES["batchSize"], BENCH_QUEUES["newBatchThreshold"]
    with azurite_site(log_dir, "throughput") as azurite:
        site = Site(azurite, "tput", log_dir).init()
        hosts = site.start_hosts(1, app_dir)
        try:
            series = [compare(site, hosts, count, rounds, timeout_s) for count in counts]
        finally:
            stop_hosts(hosts)
    head = series[0]
    return {
        "messages": head["messages"],
        "rounds": rounds,
        "concurrency": {"batch": batch, "new_batch_threshold": threshold, "max_in_flight": batch + threshold},
        "median": head["median"],
        "request_rate_ratio": head["request_rate_ratio"],
        "message_rate_ratio": head["message_rate_ratio"],
        "request_rate_ratio_target": 0.8,
        "request_rate_ratio_paired_median": head["request_rate_ratio_paired_median"],
        "runs": head["runs"],
        "by_depth": series,
    }


# --- 2. storage requests per message ------------------------------------------------------------


REQUEST_PARTS = (  # (label, counter keys) in the order printed
    ("receive", ("queue GET",)),
    ("delete", ("queue DELETE",)),
    ("ledger write", ("blob PUT",)),
    ("ledger read", ("blob GET",)),
    ("queue send", ("queue POST",)),
    ("index write", ("table PUT",)),
)
INDEX_WRITES = 1
"""The jobs index (shared/indexes/jobs.py): one Table upsert per message, at completion (a claim does
not touch it). The target is 3.1 without an index, and an index may add at most this."""


def per_message(used: Usage, messages: int, batch: int, expected: float, path: str) -> dict[str, Any]:
    """Work requests per message: idle requests subtracted, receives that found messages shared."""
    parts: dict[str, float] = {}
    counted = 0
    for label, keys in REQUEST_PARTS:
        n = sum(used.by_method.get(k, 0) for k in keys)
        if label == "receive":
            n -= used.idle_requests  # empty polls and sweep peeks are all queue GETs
        parts[label] = round(n / messages, 3)
        counted += n
    other = used.work_requests - counted
    if other:
        parts["other"] = round(other / messages, 3)
    return {
        "path": path,
        "batch_size": batch,
        "jobs": messages,
        "deliveries": used.queue.get("invocations", 0),
        "receives_with_messages": used.busy_receives,
        "messages_per_receive": round(used.queue.get("received", 0) / max(used.busy_receives, 1), 1),
        "requests_total": used.requests,
        "idle_requests_subtracted": used.idle_requests,
        "per_message": parts,
        "requests_per_message": round(used.work_requests / messages, 3),
        "expected": round(expected, 3),
        "by_method": used.by_method,
    }


def settle_housekeeping(site: Site, host: HostProcess, timeout_s: float = 90.0) -> int:
    """Wait for the host's first poison sweep and the storage requests it makes to stop; return
    their number. The sweep's timer also runs retention (shared/pipeline/retention_sweep.py: the index
    tables at most hourly, the blob rules every 5 minutes where the app applies them, as on the
    local stack): a few dozen requests once per process and hour, not a cost of the messages,
    so the paths are measured after it."""
    before = snapshot([host], site.queue)
    deadline = time.monotonic() + timeout_s
    while not int((host.stats().get("timers") or {}).get("sweep_poison", {}).get("runs", 0)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the host's poison sweep did not run in {timeout_s:.0f}s")
        time.sleep(0.2)
    work, still_since = -1, time.monotonic()
    while time.monotonic() - still_since < 1.0:  # no work request for a second: the run is over
        now = usage(before, snapshot([host], site.queue)).work_requests
        if now != work:
            work, still_since = now, time.monotonic()
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return work


def measure_path(
    site: Site,
    host: HostProcess,
    texts: Sequence[str],
    deliveries: int,
    timeout_s: float,
) -> Usage:
    """Pre-fill with the host paused, release it, wait for `deliveries` deletes, return the deltas."""
    before = snapshot([host], site.queue)
    with paused([host], RELEASE_AFTER_S):
        prefill(site.conn, site.queue, texts)
    wait_for([host], site.queue, "deletes", before.get("q.deletes", 0) + deliveries, timeout_s)
    time.sleep(0.3)  # let a last poll finish so that it is counted on both sides
    used = usage(before, snapshot([host], site.queue))
    check_clean(used, deliveries)
    return used


def requests_per_message(log_dir: Path, app_dir: Path, count: int, timeout_s: float) -> dict[str, Any]:
    """Happy, duplicate and retry paths at batch 32, and the happy path with the shipped host.json."""
    batch = BENCH_QUEUES["batchSize"]
    shipped_batch = int(shipped_queue_options()["batchSize"])
    rows = []
    with azurite_site(log_dir, "requests") as azurite:
        site = Site(azurite, "rpm", log_dir).init()
        (host,) = site.start_hosts(1, app_dir)
        housekeeping = []
        try:
            housekeeping.append(settle_housekeeping(site, host))
            ids = [f"rpm-{i:06d}" for i in range(count)]
            used = measure_path(site, host, [envelope(i) for i in ids], count, timeout_s)
            rows.append(per_message(used, count, batch, 3 + INDEX_WRITES + 1 / batch, "happy (new noop job)"))
            used = measure_path(site, host, [envelope(i) for i in ids], count, timeout_s)
            rows.append(per_message(used, count, batch, 3 + 1 / batch, "duplicate (completed job again)"))
            faults = [envelope(f"retry-{i:06d}", "fault", {"transient_failures": 1}) for i in range(count)]
            used = measure_path(site, host, faults, 2 * count, timeout_s)
            rows.append(
                per_message(
                    used,
                    count,
                    batch,
                    # first run: create, retry_scheduled, send; the retry (recorded): read,
                    # claim, complete; 2 deletes
                    8 + 2 * INDEX_WRITES + 2 / batch,
                    "retry (1 transient failure), per job",
                )
            )
        finally:
            stop_hosts([host])
        site2 = Site(azurite, "rpm16", log_dir).init()
        (host,) = site2.start_hosts(1, None)  # the repo's own host.json
        try:
            housekeeping.append(settle_housekeeping(site2, host))
            used = measure_path(
                site2, host, [envelope(f"s16-{i:06d}") for i in range(count)], count, timeout_s
            )
            rows.append(
                per_message(
                    used,
                    count,
                    shipped_batch,
                    3 + INDEX_WRITES + 1 / shipped_batch,
                    "happy, shipped host.json",
                )
            )
        finally:
            stop_hosts([host])
    return {
        "rows": rows,
        "housekeeping_requests": housekeeping,
        "target_happy": 3.1 + INDEX_WRITES,
        "index_writes_per_message": INDEX_WRITES,
        "note": (
            f"batch {batch} via a temporary app dir (host.json batchSize {batch}, newBatchThreshold "
            f"{BENCH_QUEUES['newBatchThreshold']}); the shipped host.json uses batchSize {shipped_batch}: "
            f"a receive share of 1/{shipped_batch} = {1 / shipped_batch:.4f} per message, so "
            f"{3 + 1 / shipped_batch:.3f} on the happy path when every receive is full"
        ),
    }


# --- 3. latency under a steady load -------------------------------------------------------------


def completed_latencies(log: Path, prefix: str) -> dict[str, float]:
    """latency_s of the `completed` decisions in a host log, by job id (ids starting with prefix)."""
    found: dict[str, float] = {}
    if not log.exists():
        return found
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        start = line.find('{"decision"')
        if start < 0:
            continue
        with contextlib.suppress(ValueError, KeyError, TypeError):
            record = json.loads(line[start:])
            job = str(record.get("job_id") or record.get("id") or "")
            if record["decision"] == "completed" and job.startswith(prefix):
                found[job] = float(record["latency_s"])
    return found


def latency(log_dir: Path, rate: float, seconds: float, timeout_s: float) -> dict[str, Any]:
    """A producer at `rate` jobs/s for `seconds` (created_at set at send), one host as shipped."""
    count = round(rate * seconds)
    with azurite_site(log_dir, "latency") as azurite:
        site = Site(azurite, "lat", log_dir).init()
        (host,) = site.start_hosts(1, None)
        try:
            client = queue_client(site.conn, site.queue)
            before = snapshot([host], site.queue)
            start = time.perf_counter()
            behind = 0.0
            for i in range(count):
                due = start + i / rate
                now = time.perf_counter()
                if due > now:
                    time.sleep(due - now)
                else:
                    behind = max(behind, now - due)
                client.send_message(envelope(f"lat-{i:06d}"))
            produced_s = time.perf_counter() - start
            wait_for([host], site.queue, "deletes", before.get("q.deletes", 0) + count, timeout_s)
            host_log = host.log_path
        finally:
            stop_hosts([host])
    assert host_log is not None
    lat = completed_latencies(host_log, "lat-")
    values = sorted(lat.values())
    if len(values) != count:
        raise RuntimeError(f"found {len(values)} completed decisions of {count} in {host_log}")
    return {
        "rate_per_s": rate,
        "seconds": seconds,
        "jobs": count,
        "achieved_rate_per_s": round(count / produced_s, 1),
        "producer_max_behind_s": round(behind, 3),
        "host_json": shipped_queue_options(),
        "p50_s": round(percentile(values, 50), 3),
        "p95_s": round(percentile(values, 95), 3),
        "p99_s": round(percentile(values, 99), 3),
        "max_s": round(values[-1], 3),
        "mean_s": round(statistics.fmean(values), 3),
        "source": "completed decisions in the host log: latency_s = finished - created_at",
    }


# --- 4. throughput against the number of host processes -----------------------------------------


def scaling(
    log_dir: Path, app_dir: Path, count: int, counts: Sequence[int], rounds: int, timeout_s: float
) -> dict[str, Any]:
    """Time to drain `count` jobs with k hosts competing, for each k: one Azurite, a queue per k.

    Every set of hosts is started up front and kept paused while another set is measured, so that
    rounds can alternate (k = 1, 2, 3, 1, 2, 3, ...); medians per k.
    """
    runs: dict[int, list[Drain]] = {k: [] for k in counts}
    with azurite_site(log_dir, "scaling") as azurite:
        sets: dict[int, tuple[Site, list[HostProcess]]] = {}
        try:
            for k in counts:
                site = Site(azurite, f"k{k}", log_dir).init()
                sets[k] = (site, site.start_hosts(k, app_dir))
                pause(sets[k][1])
            for r in range(rounds):
                for k in counts:
                    site, hosts = sets[k]
                    resume(hosts)
                    try:
                        drain = host_drain(site, hosts, count, f"k{k}r{r}", timeout_s)
                    finally:
                        pause(hosts)
                    runs[k].append(drain)
                    _progress(
                        f"  round {r + 1}: {k} host(s) {drain.messages_per_s:7.1f} msg/s, "
                        f"{drain.requests_per_s:7.1f} req/s"
                    )
        finally:
            for _, hosts in sets.values():
                stop_hosts(hosts)
    rows = []
    for k, drains in runs.items():
        rows.append(
            {
                "hosts": k,
                "seconds": round(median([d.seconds for d in drains]), 3),
                "messages_per_s": round(median([d.messages_per_s for d in drains]), 1),
                "requests_per_s": round(median([d.requests_per_s for d in drains]), 1),
                "consumer_cores": round(median([d.consumer_cpu_s / d.seconds for d in drains]), 2),
                "azurite_cores": round(median([d.azurite_cpu_s / d.seconds for d in drains]), 2),
                "machine_busy_cores": round(median([d.machine_busy_cores for d in drains]), 2),
                "runs": [d.to_dict() for d in drains],
            }
        )
    return {"messages": count, "rounds": rounds, "rows": rows}


# --- all four -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostBenchConfig:
    messages: int = 2000
    shallow_messages: int = 500  # a second, shallower queue (Azurite's queue calls slow with depth)
    rounds: int = 5
    rpm_messages: int = 320
    latency_rate: float = 20.0
    latency_seconds: float = 20.0
    scaling_messages: int = 2000
    scaling_rounds: int = 2
    host_counts: tuple[int, ...] = (1, 2, 3)
    timeout_s: float = 300.0

    @classmethod
    def quick(cls) -> HostBenchConfig:
        return cls(
            messages=200,
            shallow_messages=0,
            rounds=1,
            rpm_messages=64,
            latency_rate=10,
            latency_seconds=4,
            scaling_messages=200,
            scaling_rounds=1,
        )


def run_all(
    config: HostBenchConfig,
    log_dir: Path,
    sections: Sequence[str] = ("throughput", "requests", "latency", "scaling"),
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the chosen sections; each starts and stops its own Azurite and hosts."""
    global _progress
    if progress is not None:
        _progress = progress
    log_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-app-") as tmp:
        app_dir = make_app_dir(Path(tmp), BENCH_QUEUES)
        steps: dict[str, Callable[[], dict[str, Any]]] = {
            "throughput": lambda: throughput(
                log_dir,
                app_dir,
                [n for n in dict.fromkeys((config.messages, config.shallow_messages)) if n],
                config.rounds,
                config.timeout_s,
            ),
            "requests": lambda: requests_per_message(log_dir, app_dir, config.rpm_messages, config.timeout_s),
            "latency": lambda: latency(
                log_dir, config.latency_rate, config.latency_seconds, config.timeout_s
            ),
            "scaling": lambda: scaling(
                log_dir,
                app_dir,
                config.scaling_messages,
                config.host_counts,
                config.scaling_rounds,
                config.timeout_s,
            ),
        }
        for name in sections:
            _progress(f"[host bench] {name} ...")
            started = time.perf_counter()
            results[name] = steps[name]()
            results[name]["elapsed_s"] = round(time.perf_counter() - started, 1)
    return results


def _print_progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


_progress: Callable[[str], None] = _print_progress


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=None, help="jobs per drain (throughput, scaling)")
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--only", nargs="*", choices=("throughput", "requests", "latency", "scaling"))
    parser.add_argument("--logs", type=Path, default=REPO_ROOT / "bench" / "out" / "logs")
    args = parser.parse_args(argv)
    config = HostBenchConfig.quick() if args.quick else HostBenchConfig()
    if args.messages:
        config = replace(config, messages=args.messages, scaling_messages=args.messages)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = run_all(
        config, args.logs / stamp, args.only or ("throughput", "requests", "latency", "scaling")
    )
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
