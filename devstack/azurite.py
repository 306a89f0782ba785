"""Start and stop a real Azurite process (blob + queue) on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from devstack.ports import free_ports, listens_on, wait_for_port

REPO_ROOT = Path(__file__).resolve().parent.parent
AZURITE_BIN = REPO_ROOT / "node_modules" / ".bin" / "azurite"
NODE_FLAGS = ("--initial-old-space-size=256", "--min-semi-space-size=16", "--no-memory-reducer")
"""V8 flags for Azurite's Node process. With Node's defaults, after ~8 s idle V8 shrinks the heap
(a memory-reducing mark-compact to ~50 MB), and from then on every blob read runs mark-compacts
back to back (external memory pressure from its 64 KiB read buffers): measured, a 300 MB read
took 0.57 s and 0.83 s of Azurite CPU instead of 0.34 s and 0.37 s, until a restart. These flags
keep the heap it grows (python -m bench.bench_azurite_idle; docs/development.md)."""

START_TIMEOUT_S = 30.0
"""How long a start may take before it fails (its ports answering)."""
START_ATTEMPTS = 3
"""Starts on free ports before giving up (another process may take a port between the choice and
Azurite's listen)."""


class StartFailed(RuntimeError):
    """Azurite exited while starting (start_azurite tries again on other free ports)."""


# Azurite's well-known development account (public, documented; not a secret).
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def dev_connection_string(
    blob_port: int, queue_port: int, table_port: int, account: str = DEV_ACCOUNT, key: str = DEV_KEY
) -> str:
    """An account's connection string (default: the development account's) for Azurite services
    on these loopback ports."""
    return (
        "DefaultEndpointsProtocol=http;"
        f"AccountName={account};AccountKey={key};"
        f"BlobEndpoint=http://127.0.0.1:{blob_port}/{account};"
        f"QueueEndpoint=http://127.0.0.1:{queue_port}/{account};"
        f"TableEndpoint=http://127.0.0.1:{table_port}/{account};"
    )


def parse_accounts(text: str) -> tuple[tuple[str, str], ...]:
    """`AZURITE_ACCOUNTS` (`name:key[:key2];...`, Azurite's own format) as (name, first key)
    pairs; ValueError naming a malformed part (pure)."""
    found = []
    for part in text.split(";"):
        if not part.strip():
            continue
        name, _, keys = part.strip().partition(":")
        key = keys.split(":")[0]
        if not name or not key:
            raise ValueError(f"AZURITE_ACCOUNTS: {part.strip()[:40]!r} is not name:key")
        found.append((name, key))
    return tuple(found)


def accounts_setting(accounts: tuple[tuple[str, str], ...]) -> str:
    """`AZURITE_ACCOUNTS` for the development account and `accounts`: Azurite serves only the
    accounts it lists once it is set, so the development account is listed first (pure)."""
    extra = [(n, k) for n, k in accounts if n != DEV_ACCOUNT]
    return ";".join(f"{n}:{k}" for n, k in ((DEV_ACCOUNT, DEV_KEY), *extra))


@dataclass
class Azurite:
    """A running Azurite; `connection_string` points clients at it."""

    blob_port: int
    queue_port: int
    table_port: int
    location: Path
    process: subprocess.Popen[bytes] | None = None
    in_memory: bool = False
    """Keep everything in memory (`--inMemoryPersistence`): nothing on disk, no restart."""
    node_flags: tuple[str, ...] = NODE_FLAGS
    """V8 flags of the Node process (() for Node's defaults: bench/bench_azurite_idle.py)."""
    accounts: tuple[tuple[str, str], ...] = ()
    """More storage accounts it serves beside the development one, (name, base64 key) each
    (`AZURITE_ACCOUNTS`): a queue in another account (QUEUE_<NAME>_CONNECTION) locally."""
    _owns_location: bool = field(default=False, repr=False)

    @property
    def connection_string(self) -> str:
        return dev_connection_string(self.blob_port, self.queue_port, self.table_port)

    def account_connection_string(self, name: str) -> str:
        """The connection string of one of `accounts` (KeyError when it is not served)."""
        key = dict(self.accounts)[name]
        return dev_connection_string(self.blob_port, self.queue_port, self.table_port, name, key)

    def start(self, log_path: Path | None = None) -> None:
        """Start the process and wait until blob and queue ports answer."""
        if not AZURITE_BIN.exists():
            raise RuntimeError(f"Azurite is not installed: run `npm ci` in {REPO_ROOT}")
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("Node.js is not on PATH: Azurite needs it")
        args = [
            node,
            *self.node_flags,
            str(AZURITE_BIN.resolve()),
            "--silent",
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--loose",
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(self.blob_port),
            "--queueHost",
            "127.0.0.1",
            "--queuePort",
            str(self.queue_port),
            "--tableHost",
            "127.0.0.1",
            "--tablePort",
            str(self.table_port),
        ]
        args += ["--inMemoryPersistence"] if self.in_memory else ["--location", str(self.location)]
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, "AZURITE_ACCOUNTS": accounts_setting(self.accounts)} if self.accounts else None
        self.process = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            for port in (self.blob_port, self.queue_port, self.table_port):
                while True:
                    if self.process.poll() is not None:
                        code = self.process.returncode
                        raise StartFailed(f"Azurite exited with {code} while starting (a port taken?)")
                    try:
                        wait_for_port(port, timeout_s=0.5)
                        if listens_on(self.process.pid, port) is not False:
                            break  # ours (or no /proc to tell): that service is up
                        time.sleep(0.1)  # another process's: ours exits when its listen fails
                    except TimeoutError:
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"Azurite did not listen on 127.0.0.1:{port} in {START_TIMEOUT_S:.0f}s"
                        )
        except (TimeoutError, StartFailed):
            self.stop()
            raise

    def stop(self, kill: bool = False) -> None:
        """Stop the process this object started (by its PID)."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        """Stop and start again on the same ports, keeping the data on disk."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._owns_location:
            shutil.rmtree(self.location, ignore_errors=True)


def start_azurite(
    *,
    standard_ports: bool = False,
    location: Path | None = None,
    log_path: Path | None = None,
    in_memory: bool = False,
    node_flags: tuple[str, ...] = NODE_FLAGS,
    accounts: tuple[tuple[str, str], ...] = (),
) -> Azurite:
    """Start Azurite on free ports (or 10000-10002 when `standard_ports`), serving the
    development account and `accounts` ((name, key) each)."""
    owns = location is None
    loc = Path(tempfile.mkdtemp(prefix="azurite-")) if location is None else location
    loc.mkdir(parents=True, exist_ok=True)
    attempts = 1 if standard_ports else START_ATTEMPTS
    for attempt in range(1, attempts + 1):
        blob, queue, table = (10000, 10001, 10002) if standard_ports else free_ports(3)
        az = Azurite(
            blob,
            queue,
            table,
            location=loc,
            _owns_location=owns,
            in_memory=in_memory,
            node_flags=node_flags,
            accounts=accounts,
        )
        try:
            az.start(log_path=log_path)
            return az
        except StartFailed:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")  # the last attempt returns or raises


if __name__ == "__main__":  # manual use: python -m devstack.azurite
    azurite = start_azurite(standard_ports=os.environ.get("AZURITE_STANDARD_PORTS") == "1")
    print(azurite.connection_string, flush=True)
    try:
        signal.pause()
    finally:
        azurite.cleanup()
