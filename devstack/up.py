"""`make up`: Azurite on its standard ports and the local Functions host on 7071, until Ctrl-C."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time

from devstack.azurite import start_azurite
from devstack.hostproc import REPO_ROOT, HostProcess, host_env


def main() -> int:
    local = REPO_ROOT / "local.settings.json"
    if not local.exists():  # what func start and the CLI read
        shutil.copy(REPO_ROOT / "local.settings.sample.json", local)
        print("created local.settings.json from local.settings.sample.json")
    data = REPO_ROOT / ".devstack" / "azurite-data"
    azurite = start_azurite(
        standard_ports=True, location=data, log_path=REPO_ROOT / ".devstack" / "azurite.log"
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
        subprocess.run(
            [sys.executable, "-m", "shared.interfaces.cli", "init"], env=env, cwd=REPO_ROOT, check=True
        )
        host = HostProcess(env, port=7071, log_path=REPO_ROOT / ".devstack" / "host.log").start()
        print(
            "\nup:\n"
            "  Azurite blob   http://127.0.0.1:10000/devstoreaccount1  (UseDevelopmentStorage=true)\n"
            "  Azurite queue  http://127.0.0.1:10001/devstoreaccount1\n"
            "  Azurite table  http://127.0.0.1:10002/devstoreaccount1\n"
            f"  Functions      {host.url}/api/  (health: {host.url}/api/health)\n"
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
