"""Chaos run: competing local hosts killed with -9, Azurite restarted, faults and bad input.

Checks at the end: every good job applied exactly once (its side effect counted), every bad one
in the poison archive with a reason, nothing left in flight. Used by the short test in
`make test` and by the long run (`make chaos-long`).
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azure.storage.blob import ContainerClient
from azure.storage.queue import QueueClient

from devstack.azurite import Azurite, start_azurite
from devstack.hostproc import REPO_ROOT, HostProcess, count_decisions, host_env
from tests.integration.effects import count_effects

QUEUE = "chaos"
HOST_JSON_QUEUES = {"batchSize": 16, "newBatchThreshold": 8, "maxPollingInterval": "00:00:01",
                    "visibilityTimeout": "00:00:01", "maxDequeueCount": 10, "messageEncoding": "base64"}  # fmt: skip
SETTINGS = {"JOBS_QUEUE": QUEUE, "ENABLE_TEST_KINDS": "1", "MAX_ATTEMPTS": "12", "RETRY_BASE_SECONDS": "0.5",
            "RETRY_MAX_SECONDS": "4", "CLAIM_LEASE_SECONDS": "6", "DEVHOST_MESSAGE_LEASE_SECONDS": "8"}  # fmt: skip


@dataclass
class ChaosConfig:
    """What the run does."""

    jobs: int = 150
    """Good jobs (each applies one side effect)."""
    hosts: int = 3
    """Local host processes competing for the queue."""
    kill_every_s: tuple[float, float] = (2.0, 4.0)
    """A random host is killed with -9 (and restarted) after a delay drawn from this range."""
    min_kills: int = 5
    """Kills spread over the run by progress, whatever the machine's speed: one each time another
    1/(min_kills+1) of the good jobs has completed, on top of the timed kills."""
    bad_share: float = 0.05
    """Share of extra, permanently bad messages."""
    duplicate_share: float = 0.05
    """Share of good jobs delivered a second time."""
    transient_rate: float = 0.2
    """Chance that one attempt of a good job fails transiently."""
    max_sleep_s: float = 0.5
    """Each good job sleeps up to this long, so kills meet work in flight."""
    restart_azurite: bool = True
    """Restart Azurite once, when about half the jobs are done."""
    timeout_s: float = 600.0
    seed: int = 1


@dataclass
class ChaosReport:
    """What happened, and what was checked."""

    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def text(self) -> str:
        width = max(len(k) for k in self.figures)
        lines = [f"  {k:<{width}}  {v}" for k, v in self.figures.items()]
        return "\n".join(lines + [f"  PROBLEM: {p}" for p in self.problems])


def _app_dir(workdir: Path) -> Path:
    target = workdir / "app"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("function_app.py", "shared"):
        if not (target / name).exists():
            os.symlink(REPO_ROOT / name, target / name)
    host = json.loads((REPO_ROOT / "host.json").read_text())
    host["extensions"]["queues"].update(HOST_JSON_QUEUES)
    (target / "host.json").write_text(json.dumps(host))
    return target


VALID_ENVELOPES = {"permanent failure"}
"""Bad messages that are valid envelopes: their job is poisoned. The others never touch the ledger."""


def _bad_messages(count: int, rng: random.Random) -> list[tuple[str, str | None, str]]:
    """(label, job id or None, raw base64 text) of permanently bad messages."""
    out = []
    kinds = ["not json", "no id", "unknown kind", "permanent failure", "path trick", "wrong types"]
    for i in range(count):
        label = kinds[i % len(kinds)]
        job_id: str | None = f"bad-{i:04d}"
        if label == "not json":
            raw, job_id = b"{broken " + str(i).encode(), None
        elif label == "no id":
            raw, job_id = json.dumps({"kind": "noop", "payload": {"n": i}}).encode(), None
        elif label == "unknown kind":
            raw = json.dumps({"id": job_id, "kind": "median", "payload": {}}).encode()
        elif label == "permanent failure":
            raw = json.dumps({"id": job_id, "kind": "fault", "payload": {"permanent": True}}).encode()
        elif label == "path trick":
            raw = json.dumps({"id": job_id, "kind": "noop", "payload_ref": f"../{i}/secret"}).encode()
        else:
            raw = json.dumps({"id": job_id, "kind": "noop", "payload": {}, "attempt": "one"}).encode()
        out.append((label, job_id, base64.b64encode(raw).decode()))
    rng.shuffle(out)
    return out


class Chaos:
    def __init__(self, cfg: ChaosConfig, workdir: Path) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.rng = random.Random(cfg.seed)
        self.azurite: Azurite | None = None
        self.hosts: list[HostProcess] = []
        self.kills = 0
        self.azurite_restarts = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    # -- setup -----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        assert self.azurite is not None
        return host_env(self.azurite.connection_string, SETTINGS)

    def start_host(self, index: int) -> HostProcess:
        host = HostProcess(self.env(), instance_id=f"host-{index}", log_path=self.workdir / f"host-{index}.log",
                           extra_args=["--app-dir", str(_app_dir(self.workdir)), "--no-http"])  # fmt: skip
        return host.start()

    def queue(self, name: str = QUEUE) -> QueueClient:
        assert self.azurite is not None
        return QueueClient.from_connection_string(self.azurite.connection_string, name)

    def container(self, name: str) -> ContainerClient:
        assert self.azurite is not None
        return ContainerClient.from_connection_string(self.azurite.connection_string, name)

    def good_body(self, job_id: str) -> str:
        payload = {
            "effect": True,
            "transient_rate": self.cfg.transient_rate,
            "sleep_s": round(self.rng.uniform(0, self.cfg.max_sleep_s), 3),
        }
        return base64.b64encode(
            json.dumps({"id": job_id, "kind": "fault", "payload": payload}).encode()
        ).decode()

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> ChaosReport:
        cfg = self.cfg
        self.azurite = start_azurite(location=self.workdir / "azurite", log_path=self.workdir / "azurite.log")
        started = time.monotonic()
        try:
            subprocess.run([sys.executable, "-m", "shared.cli", "init"], env=self.env(), cwd=REPO_ROOT,
                           check=True, capture_output=True)  # fmt: skip
            good = [f"job-{i:05d}" for i in range(cfg.jobs)]
            bodies = {job_id: self.good_body(job_id) for job_id in good}
            bad = _bad_messages(max(6, int(cfg.jobs * cfg.bad_share)), self.rng)
            queue = self.queue()
            for text in list(bodies.values()) + [raw for _, _, raw in bad]:
                queue.send_message(text)
            self.hosts = [self.start_host(i) for i in range(cfg.hosts)]
            killer = threading.Thread(target=self.kill_loop, daemon=True)
            killer.start()
            duplicates = self.rng.sample(good, max(1, int(cfg.jobs * cfg.duplicate_share)))
            replayed = self.wait(good, bodies, duplicates)
            self.stop.set()
            killer.join(timeout=30)
            return self.check(good, bad, duplicates, replayed, time.monotonic() - started)
        finally:
            self.stop.set()
            for host in self.hosts:
                host.stop(timeout_s=15)
            if self.azurite:
                self.azurite.cleanup()

    def kill_loop(self) -> None:
        lo, hi = self.cfg.kill_every_s
        while not self.stop.wait(self.rng.uniform(lo, hi)):
            self.kill_one()

    def kill_one(self) -> None:
        """Kill a random host with -9 and start it again."""
        with self.lock:
            index = self.rng.randrange(len(self.hosts))
            self.hosts[index].kill()
            self.kills += 1
            try:
                self.hosts[index] = self.start_host(index)
            except Exception:  # Azurite may be restarting: try again
                time.sleep(1)
                self.hosts[index] = self.start_host(index)

    def kill_on_progress(self, done: int, total: int) -> None:
        """Keep the kill count at or above what progress calls for, however fast the jobs ran."""
        step = max(1, total // (self.cfg.min_kills + 1))
        wanted = min(self.cfg.min_kills, done // step)
        while self.kills < wanted:
            self.kill_one()

    def statuses(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        ledger = self.container("ledger")
        out = {}
        for blob in ledger.list_blobs():
            job_id = blob.name.removesuffix(".json")
            out[job_id] = json.loads(ledger.download_blob(blob.name).readall())
        return {i: out[i] for i in ids if i in out}

    def wait(self, good: list[str], bodies: dict[str, str], duplicates: list[str]) -> list[str]:
        """Until every good job completed and the queues are empty; restarts Azurite half-way."""
        deadline = time.monotonic() + self.cfg.timeout_s
        restarted = not self.cfg.restart_azurite
        sent_duplicates = False
        replayed: list[str] = []
        while time.monotonic() < deadline:
            try:
                records = self.statuses(good)
                pending = self.queue().get_queue_properties().approximate_message_count
                pending_poison = (
                    self.queue(f"{QUEUE}-poison").get_queue_properties().approximate_message_count
                )
            except Exception:
                time.sleep(1)
                continue
            done = sum(1 for r in records.values() if r.get("status") == "completed")
            self.kill_on_progress(done, len(good))
            if not restarted and done >= len(good) // 2:
                with self.lock:
                    assert self.azurite is not None
                    self.azurite.restart()
                    self.azurite_restarts += 1
                restarted = True
            if not sent_duplicates and done >= len(good) * 3 // 4:
                for job_id in duplicates:
                    self.queue().send_message(bodies[job_id])
                sent_duplicates = True
            # A good job the host poisoned (kills pushed it past maxDequeueCount) is replayed, as an operator would.
            stuck = [i for i, r in records.items() if r.get("status") == "poisoned" and i not in replayed]
            if stuck and pending_poison == 0:
                self.replay(stuck)
                replayed.extend(stuck)
            if done == len(good) and sent_duplicates and restarted and pending == 0 and pending_poison == 0:
                return replayed
            time.sleep(1.0)
        raise TimeoutError(f"chaos run not finished after {self.cfg.timeout_s:.0f}s")

    def replay(self, ids: list[str]) -> None:
        cmd = [sys.executable, "-m", "shared.cli", "poison", "replay", "--ids", ",".join(ids), "--rate", "50"]
        subprocess.run(cmd, env=self.env(), cwd=REPO_ROOT, check=True, capture_output=True)

    # -- the verdict -----------------------------------------------------------------------

    def check(self, good: list[str], bad: list[tuple[str, str | None, str]], duplicates: list[str],
              replayed: list[str], elapsed: float) -> ChaosReport:  # fmt: skip
        report = ChaosReport()
        effects = count_effects(self.container("results"))
        records = self.statuses(good + [job_id for _, job_id, _ in bad if job_id])
        not_once = [i for i in good if effects.applied[i] != 1]
        if not_once:
            report.problems.append(f"{len(not_once)} good jobs not applied exactly once: {not_once[:5]}")
        unfinished = [i for i in good if records.get(i, {}).get("status") != "completed"]
        if unfinished:
            report.problems.append(f"{len(unfinished)} good jobs not completed: {unfinished[:5]}")
        archive = self.container("poison-archive")
        entries = [json.loads(archive.download_blob(b.name).readall()) for b in archive.list_blobs()
                   if b.name.startswith(("jobs/", "unparsed/"))]  # fmt: skip
        archived_ids = {e["job_id"] for e in entries if e.get("reason") and e.get("state") == "poisoned"}
        unnamed = sum(1 for e in entries if e["job_id"] is None and e.get("reason"))
        for label, job_id, _ in bad:
            if job_id is None:
                continue
            if job_id not in archived_ids:
                report.problems.append(f"bad message {label!r} ({job_id}) is not archived with a reason")
            status = records.get(job_id, {}).get("status")
            if label in VALID_ENVELOPES and status != "poisoned":
                report.problems.append(f"bad message {label!r} ({job_id}) is {status}, not poisoned")
            if label not in VALID_ENVELOPES and status is not None:  # its id may be another job's
                report.problems.append(
                    f"malformed message {label!r} ({job_id}) changed the ledger ({status})"
                )
        expected_unnamed = sum(1 for _, job_id, _ in bad if job_id is None)
        if unnamed < expected_unnamed:
            report.problems.append(
                f"{expected_unnamed - unnamed} bad messages without an id are not archived"
            )
        in_flight = [
            i for i, r in records.items() if r.get("status") in ("in_progress", "retry_scheduled", "queued")
        ]
        if in_flight:
            report.problems.append(f"{len(in_flight)} jobs left in flight: {in_flight[:5]}")
        decisions = self.decisions()
        report.figures = {
            "good jobs": len(good),
            "applied exactly once (side effects counted)": len(good) - len(not_once),
            "bad messages": len(bad),
            "bad messages poisoned with a reason": len(bad)
            - sum("bad message" in p for p in report.problems),
            "host processes": self.cfg.hosts,
            "kill -9 of a host (each restarted)": self.kills,
            "Azurite restarts (data on disk)": self.azurite_restarts,
            "duplicate deliveries sent": len(duplicates),
            "duplicates suppressed (decision=duplicate)": decisions["duplicate"],
            "retries scheduled (transient faults)": decisions["retry_scheduled"],
            "busy (live claim elsewhere, message returned)": decisions["busy"],
            "stale messages acknowledged": decisions["stale"],
            "re-executions absorbed by the idempotent effect": sum(effects.repeats.values()),
            "good jobs the host poisoned and the operator replayed": len(replayed),
            "elapsed": f"{elapsed:.0f} s",
        }
        return report

    def decisions(self) -> Counter[str]:
        return count_decisions(*self.workdir.glob("host-*.log"))


def run_chaos(cfg: ChaosConfig, workdir: Path) -> ChaosReport:
    workdir.mkdir(parents=True, exist_ok=True)
    return Chaos(cfg, workdir).run()


if __name__ == "__main__":  # python -m tests.chaos.harness [jobs]
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    out = REPO_ROOT / ".devstack" / time.strftime("chaos-%Y%m%d-%H%M%S")
    result = run_chaos(ChaosConfig(jobs=jobs, timeout_s=3600), out)
    print(result.text())
    sys.exit(1 if result.problems else 0)
