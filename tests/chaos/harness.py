"""Chaos run: competing local hosts killed with -9, Azurite restarted, faults and bad input.

Checks at the end: every good job applied exactly once (its side effect counted), every bad one
in the poison archive with a reason, nothing left in flight. Used by the short test in
`make test` and by the long run (`make chaos-long`). With `storage_faults`, the hosts reach
Azurite through a fault-injecting proxy (devstack/faultproxy.py).
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

from devstack.azurite import DEV_ACCOUNT, Azurite, start_azurite
from devstack.faultproxy import FaultProxy, FaultRule
from devstack.hostproc import REPO_ROOT, HostProcess, count_decisions, host_env
from tests.integration.effects import count_effects

QUEUE = "chaos"
SETTINGS = {"JOBS_QUEUE": QUEUE, "ENABLE_TEST_KINDS": "1", "MAX_ATTEMPTS": "12"}
"""Production timing: the shipped host.json as it is, and the claim lease, heartbeat and retry
backoff at their defaults. Only the host's message lease after a kill (`ChaosConfig.host_lease_s`)
may be shortened. MAX_ATTEMPTS is raised from 5: each attempt of a good job fails with
probability `transient_rate` (0.2), drawn from the job id and attempt, so with 5 attempts one
good job in 3,125 would be poisoned by design, and again after every replay."""
LEDGER_WRITES = rf"^/{DEV_ACCOUNT}/ledger/"
"""storage_faults: the path of ledger blobs (the hosts' LEDGER_CONTAINER, from the settings sample)."""
FAULT_ROUNDS = 8
"""storage_faults: rounds of (pause, 503 burst, pause, unanswered writes), from the start of the run."""
FAULT_PAUSE_S = (1.0, 3.0)
LEDGER_BURST_S = (2.0, 4.0)
"""storage_faults: how long each burst of 503 answers to ledger writes lasts."""
UNANSWERED_PER_ROUND = 5
"""storage_faults: conditional ledger writes forwarded but left unanswered, per round."""
UNANSWERED_CHANCE = 0.3
"""storage_faults: each conditional ledger write is picked with this chance, so that when writes are
few, the retries of one write are not all dropped too."""


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
    storage_faults: bool = True
    """Put a fault-injecting proxy between the hosts and Azurite, and inject on a schedule: bursts of
    503 on ledger writes, and conditional ledger writes applied but unanswered (see `fault_loop`)."""
    host_lease_s: float = 600.0
    """How long a killed host's messages stay invisible (the real host's fixed 10-minute lease).
    The short run shortens it to 60 s, still longer than the 30-s claim lease as in production."""
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


VALID_ENVELOPES = {"permanent failure"}
"""Bad messages that are valid envelopes: their job is poisoned. The others carry an id of their own
(no good job shares it): a `poisoned` record is created for it (create-only, never a change of an
existing record), so `GET /api/jobs/{id}` answers with the reason."""


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
        self.proxy: FaultProxy | None = None
        self.fault_rng = random.Random(cfg.seed + 1)  # its own: the kill schedule stays as without faults
        self.kills = 0
        self.azurite_restarts = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    # -- setup -----------------------------------------------------------------------------

    def settings(self) -> dict[str, str]:
        return {**SETTINGS, "DEVHOST_MESSAGE_LEASE_SECONDS": str(self.cfg.host_lease_s)}

    def env(self) -> dict[str, str]:
        """For the CLI runs (init, replay): straight to Azurite, never through the fault proxy."""
        assert self.azurite is not None
        return host_env(self.azurite.connection_string, self.settings())

    def start_host(self, index: int) -> HostProcess:
        assert self.azurite is not None
        env = host_env(self.azurite.connection_string, self.settings(), storage_proxy=self.proxy)
        host = HostProcess(env, instance_id=f"host-{index}", log_path=self.workdir / f"host-{index}.log",
                           extra_args=["--no-http"])  # fmt: skip
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
        if cfg.storage_faults:
            self.proxy = FaultProxy.for_azurite(self.azurite).start()
        started = time.monotonic()
        try:
            subprocess.run([sys.executable, "-m", "shared.interfaces.cli", "init"], env=self.env(), cwd=REPO_ROOT,
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
            faults = threading.Thread(target=self.fault_loop, daemon=True)
            if self.proxy is not None:
                faults.start()
            duplicates = self.rng.sample(good, max(1, int(cfg.jobs * cfg.duplicate_share)))
            replayed = self.wait(good, bodies, duplicates)
            self.stop.set()
            killer.join(timeout=30)
            if faults.is_alive():
                faults.join(timeout=30)
            return self.check(good, bad, duplicates, replayed, time.monotonic() - started)
        finally:
            self.stop.set()
            for host in self.hosts:
                host.stop(timeout_s=15)
            if self.proxy:
                self.proxy.stop()
            if self.azurite:
                self.azurite.cleanup()

    def kill_loop(self) -> None:
        lo, hi = self.cfg.kill_every_s
        while not self.stop.wait(self.rng.uniform(lo, hi)):
            self.kill_one()

    def fault_loop(self) -> None:
        """FAULT_ROUNDS times: a burst of 503 on ledger writes, then a few conditional ledger writes
        forwarded to Azurite (so applied, if their condition holds) whose answers are dropped."""
        assert self.proxy is not None
        pause, rng = FAULT_PAUSE_S, self.fault_rng
        for _ in range(FAULT_ROUNDS):
            if self.stop.wait(rng.uniform(*pause)):
                return
            burst_s = rng.uniform(*LEDGER_BURST_S)
            self.proxy.add(FaultRule("error", methods=("PUT",), path=LEDGER_WRITES, service="blob",
                                     for_s=burst_s, since="set"))  # fmt: skip
            if self.stop.wait(burst_s + rng.uniform(*pause)):
                return
            self.proxy.add(FaultRule("drop_answer", methods=("PUT",), path=LEDGER_WRITES, service="blob",
                                     has_header=("If-Match", "If-None-Match"), count=UNANSWERED_PER_ROUND,
                                     chance=UNANSWERED_CHANCE))  # fmt: skip

    def fault_figures(self) -> dict[str, Any]:
        assert self.proxy is not None
        rules = self.proxy.rules()
        bursts = [r for r in rules if r.action == "error"]
        drops = [r for r in rules if r.action == "drop_answer"]
        return {
            "storage requests through the fault proxy": self.proxy.stats()["requests"],
            "ledger 503 bursts": len(bursts),
            "ledger writes answered 503": sum(r.injected for r in bursts),
            "ledger writes applied but unanswered": sum(
                n for r in drops for status, n in r.dropped_statuses.items() if 200 <= status < 300
            ),
            "ledger writes refused by Azurite, answer dropped": sum(
                n for r in drops for status, n in r.dropped_statuses.items() if status >= 300
            ),
        }

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
        cmd = [
            sys.executable,
            "-m",
            "shared.interfaces.cli",
            "poison",
            "replay",
            "--ids",
            ",".join(ids),
            "--rate",
            "50",
        ]
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
            record = records.get(job_id, {})
            if record.get("status") != "poisoned" or not record.get("reason"):
                report.problems.append(
                    f"bad message {label!r} ({job_id}) is {record.get('status')}, not poisoned with a reason"
                )
        expected_unnamed = sum(1 for _, job_id, _ in bad if job_id is None)
        if unnamed < expected_unnamed:
            report.problems.append(
                f"{expected_unnamed - unnamed} bad messages without an id are not archived"
            )
        takeovers = {i: takeovers_of(records.get(i, {})) for i in good}
        died = [i for i in good if runs_died_of(records.get(i, {}))]
        if died:
            report.problems.append(f"{len(died)} good jobs poisoned at the takeover limit: {died[:5]}")
        in_flight = [
            i for i, r in records.items() if r.get("status") in ("in_progress", "retry_scheduled", "queued")
        ]
        if in_flight:
            report.problems.append(f"{len(in_flight)} jobs left in flight: {in_flight[:5]}")
        decisions = self.decisions()
        report.figures = {
            "timing": f"shipped host.json, default claim settings, host message lease {self.cfg.host_lease_s:.0f} s",
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
            "most takeovers of one good job (runs that died)": max(takeovers.values(), default=0),
            "good jobs poisoned at the takeover limit (runs_died)": len(died),
        }
        if self.proxy is not None:
            report.figures.update(self.fault_figures())
        report.figures["elapsed"] = f"{elapsed:.0f} s"
        return report

    def decisions(self) -> Counter[str]:
        return count_decisions(*self.workdir.glob("host-*.log"))


def takeovers_of(record: dict[str, Any]) -> int:
    """Claims in a record's history that took over a dead run's expired claim."""
    return sum(1 for entry in record.get("history") or [] if entry.get("takeover_of"))


def runs_died_of(record: dict[str, Any]) -> bool:
    """True when the record was ever poisoned at the takeover limit."""
    return any(
        entry.get("event") == "poisoned" and str(entry.get("reason", "")).startswith("runs_died")
        for entry in record.get("history") or []
    )


def run_chaos(cfg: ChaosConfig, workdir: Path) -> ChaosReport:
    workdir.mkdir(parents=True, exist_ok=True)
    return Chaos(cfg, workdir).run()


if __name__ == "__main__":  # [CHAOS_STORAGE_FAULTS=0] python -m tests.chaos.harness [jobs]
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    out = REPO_ROOT / ".devstack" / time.strftime("chaos-%Y%m%d-%H%M%S")
    faults = os.environ.get("CHAOS_STORAGE_FAULTS", "1") == "1"
    result = run_chaos(ChaosConfig(jobs=jobs, timeout_s=3600, storage_faults=faults), out)
    print(result.text())
    sys.exit(1 if result.problems else 0)
