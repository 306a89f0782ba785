"""`make up`: Azurite on its standard ports and the local Functions host on 7071, until Ctrl-C.

Several job queues when the settings declare them (`JOBS_QUEUES` in local.settings.json or the
environment): the host listens on each (and its `-poison` queue). A queue in another storage
account (`QUEUE_<NAME>_CONNECTION` naming a connection setting) works locally when Azurite serves
that account too: `AZURITE_ACCOUNTS` (Azurite's `name:key;...`) in the same settings; Azurite then
serves the development account and those, and this script creates such queues there (in Azure
the queue's owner does). docs/development.md, *Several queues locally*."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

from azure.core.exceptions import ResourceExistsError

from devstack.azurite import parse_accounts, start_azurite
from devstack.hostproc import REPO_ROOT, HostProcess, host_env
from shared.config.settings import storage_connection
from shared.queues import QueueSet, read_queues
from shared.storage.clients import clients_for


def create_other_account_queues(env: Mapping[str, str], queues: QueueSet) -> list[str]:
    """Create each queue in another account (and its `-poison` queue) there, as its owner would
    in Azure; returns `<queue> (<connection setting>)` for the banner."""
    made = []
    for queue in queues:
        if queue.connection is None:
            continue
        service = clients_for(storage_connection(env, queue.connection)).queue_service
        for name in (queue.name, queue.poison):
            with contextlib.suppress(ResourceExistsError):
                service.create_queue(name)
        made.append(f"{queue.name} ({queue.connection})")
    return made


def queue_lines(queues: QueueSet, elsewhere: list[str]) -> str:
    """The banner's line of declared queues (pure)."""
    names = [f"{q.name}{' (default)' if q.default else ''}" for q in queues if q.connection is None]
    return f"  Job queues     {', '.join([*names, *elsewhere])}\n"


def main() -> int:
    local = REPO_ROOT / "local.settings.json"
    if not local.exists():  # what func start and the CLI read
        shutil.copy(REPO_ROOT / "local.settings.sample.json", local)
        print("created local.settings.json from local.settings.sample.json")
    data = REPO_ROOT / ".devstack" / "azurite-data"
    accounts = parse_accounts(host_env("UseDevelopmentStorage=true").get("AZURITE_ACCOUNTS", ""))
    azurite = start_azurite(
        standard_ports=True,
        location=data,
        log_path=REPO_ROOT / ".devstack" / "azurite.log",
        accounts=accounts,
    )
    host: HostProcess | None = None
    cluster = None
    try:
        spark_settings: dict[str, str] = {}
        if "--no-spark" not in sys.argv:
            from devstack.spark_cluster import start_cluster

            cluster = start_cluster(base_dir=REPO_ROOT / ".devstack" / "spark")
            spark_settings = cluster.env()
        env = host_env("UseDevelopmentStorage=true", spark_settings)
        queues = read_queues(env)  # SettingsError names a bad JOBS_QUEUES / QUEUE_<NAME>_* setting
        elsewhere = create_other_account_queues(env, queues)
        subprocess.run(
            [sys.executable, "-m", "shared.interfaces.cli", "init"], env=env, cwd=REPO_ROOT, check=True
        )
        host = HostProcess(env, port=7071, log_path=REPO_ROOT / ".devstack" / "host.log").start()
        print(
            "\nup:\n"
            "  Azurite blob   http://127.0.0.1:10000/devstoreaccount1  (UseDevelopmentStorage=true)\n"
            "  Azurite queue  http://127.0.0.1:10001/devstoreaccount1\n"
            "  Azurite table  http://127.0.0.1:10002/devstoreaccount1\n"
            + queue_lines(queues, elsewhere)
            + (
                f"  Accounts       {', '.join(n for n, _ in accounts)} (AZURITE_ACCOUNTS)\n"
                if accounts
                else ""
            )
            + f"  Functions      {host.url}/api/  (health: {host.url}/api/health)\n"
            f"  Console        {host.url}/api/console  (operators: jobs, timelines, poison)\n"
            + (f"  Spark REST     {cluster.rest_url}  (master UI {cluster.ui_url})\n" if cluster else "")
            + "  logs           .devstack/host.log, .devstack/azurite.log; data in .devstack/azurite-data\n"
            "Ctrl-C stops everything.",
            flush=True,
        )
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while host.process is not None and host.process.poll() is None:
            time.sleep(1)
        print("the host stopped; see .devstack/host.log", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if host:
            host.stop()
        if cluster:
            cluster.stop()
        azurite.stop()
        print("stopped.")


if __name__ == "__main__":
    sys.exit(main())
