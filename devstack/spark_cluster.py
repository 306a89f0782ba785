"""Start and stop a real Spark standalone cluster (one master, one worker) from the pyspark wheel.

The wheel carries `bin/spark-class` and the jars but no start-master.sh, so the daemons are started
directly. Everything binds to loopback on free ports; each daemon runs in its own process group
(drivers and executors are children of the worker, so stopping the worker's group stops them too).
The REST submission API is enabled on the master: that is what the `standalone` backend talks to.

Manual use: `python -m devstack.spark_cluster` prints the URLs and stays up until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack.ports import free_port, wait_for_port

REPO_ROOT = Path(__file__).resolve().parent.parent
JOB_FILE = REPO_ROOT / "spark_jobs" / "aggregate_job.py"


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark wheel."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def java_ok() -> bool:
    """True when a Java 17+ runtime is on PATH (Spark 4 needs it)."""
    java = shutil.which("java")
    if java is None:
        return False
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    for token in out.replace('"', " ").split():
        head = token.split(".")[0]
        if head.isdigit() and "." in token:
            return int(head) >= 17
    return False


@dataclass
class SparkCluster:
    """A running standalone master + worker; `rest_url` is the REST submission API."""

    base_dir: Path
    master_port: int
    rest_port: int
    master_ui_port: int
    worker_ui_port: int
    cores: int = 4
    memory: str = "4g"
    python: str = sys.executable
    master: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None
    _owns_dir: bool = field(default=False, repr=False)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.master_ui_port}"

    @property
    def worker_ui_url(self) -> str:
        return f"http://127.0.0.1:{self.worker_ui_port}"

    @property
    def conf_dir(self) -> Path:
        return self.base_dir / "conf"

    @property
    def work_dir(self) -> Path:
        return self.base_dir / "work"

    @property
    def log_dir(self) -> Path:
        return self.base_dir / "logs"

    def env(self) -> dict[str, str]:
        """The app settings that point the `standalone` backend at this cluster."""
        return {
            "SPARK_BACKEND": "standalone",
            "SPARK_URL": self.rest_url,
            "SPARK_MASTER_URL": self.master_url,
            "SPARK_MASTER_UI_URL": self.ui_url,
            "SPARK_JOB_FILE": str(JOB_FILE),
            "SPARK_PYTHON": self.python,
        }

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout_s: float = 90.0) -> None:
        """Write the config, start master then worker, and wait until both are usable."""
        for d in (self.conf_dir, self.work_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "spark-defaults.conf").write_text(self._defaults(), encoding="utf-8")
        self.start_master(timeout_s)
        self.worker = self._spawn(
            "worker",
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--webui-port",
                str(self.worker_ui_port),
                "--work-dir",
                str(self.work_dir),
                "--properties-file",
                str(self.conf_dir / "spark-defaults.conf"),
                self.master_url,
            ],
        )
        self._wait(lambda: self.alive_workers() > 0, timeout_s, "worker registered with the master")

    def start_master(self, timeout_s: float = 90.0) -> None:
        """Start the master (also used by `restart_master`) and wait for its REST API."""
        self.master = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.master_ui_port),
                "--properties-file",
                str(self.conf_dir / "spark-defaults.conf"),
            ],
        )
        wait_for_port(self.master_port, timeout_s)
        self._wait(self.rest_ready, timeout_s, "master REST API answering")

    def restart_master(self, timeout_s: float = 90.0) -> None:
        """Kill the master (SIGKILL, no recovery mode) and start a new one on the same ports.

        The new master has forgotten every earlier submission; the worker re-registers with it.
        """
        self.kill_master()
        self.revive_master(timeout_s)

    def kill_master(self) -> None:
        """SIGKILL the master: its REST API and UI stop answering until `revive_master`."""
        _stop_group(self.master, kill=True)
        self.master = None
        wait_free(self.rest_port, 30.0)
        wait_free(self.master_port, 30.0)

    def revive_master(self, timeout_s: float = 90.0) -> None:
        """Start a new master on the same ports (it knows no earlier submission); wait for the worker."""
        self.start_master(timeout_s)
        self._wait(lambda: self.alive_workers() > 0, timeout_s, "worker re-registered")

    def stop(self) -> None:
        """Stop the worker's group (with its drivers and executors), then the master's."""
        _stop_group(self.worker)
        _stop_group(self.master)
        self.worker = None
        self.master = None

    def cleanup(self) -> None:
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # -- observation ------------------------------------------------------------------------------

    def rest_ready(self) -> bool:
        """The REST API answers a status request (for an id it does not know)."""
        try:
            body = _get_json(f"{self.rest_url}/v1/submissions/status/x", 2.0)
        except (OSError, ValueError):
            return False
        return body.get("action") == "SubmissionStatusResponse"

    def master_state(self) -> dict[str, Any]:
        """The master UI's JSON: workers, apps, drivers."""
        return _get_json(f"{self.ui_url}/json/", 5.0)

    def alive_workers(self) -> int:
        try:
            workers = self.master_state().get("workers", [])
        except (OSError, ValueError):
            return 0
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def drivers(self) -> list[dict[str, Any]]:
        """Active and completed drivers as the master reports them."""
        state = self.master_state()
        return list(state.get("activedrivers", [])) + list(state.get("completeddrivers", []))

    def driver_log(self, driver_id: str, log_type: str = "stderr") -> str:
        """A driver's stdout/stderr as written in the worker's work dir."""
        path = self.work_dir / driver_id / log_type
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def running_driver_processes(self) -> int:
        """Driver JVMs alive under the worker (for 'no second driver' assertions)."""
        out = subprocess.run(["ps", "-eo", "pid,pgid,args"], capture_output=True, text=True, check=False)
        if self.worker is None:
            return 0
        pgid = str(self.worker.pid)
        return sum(
            1
            for line in out.stdout.splitlines()
            if line.split(None, 2)[1:2] == [pgid] and "org.apache.spark.deploy.worker.DriverWrapper" in line
        )

    # -- internals --------------------------------------------------------------------------------

    def _defaults(self) -> str:
        props = {
            "spark.master.rest.enabled": "true",
            "spark.master.rest.host": "127.0.0.1",
            "spark.master.rest.port": str(self.rest_port),
            "spark.ui.showConsoleProgress": "false",
            "spark.ui.enabled": "false",
            "spark.worker.ui.retainedDrivers": "200",
            "spark.deploy.retainedDrivers": "200",
            "spark.deploy.retainedApplications": "200",
            "spark.pyspark.python": self.python,
            "spark.pyspark.driver.python": self.python,
        }
        return "".join(f"{k} {v}\n" for k, v in props.items())

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        home = spark_home()
        env = dict(os.environ)
        for key in list(env):
            if key.startswith(("SPARK_", "PYSPARK_")):
                del env[key]
        env.update(
            SPARK_HOME=str(home),
            SPARK_CONF_DIR=str(self.conf_dir),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_HOSTNAME="127.0.0.1",
            SPARK_LOG_DIR=str(self.log_dir),
            SPARK_WORKER_DIR=str(self.work_dir),
            SPARK_NO_DAEMONIZE="1",
            PYSPARK_PYTHON=self.python,
        )
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            return subprocess.Popen(
                [str(home / "bin" / "spark-class"), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.base_dir,
                start_new_session=True,
            )
        finally:
            log.close()

    def _wait(self, check: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check():
                return
            for proc in (self.master, self.worker):
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited early; see {self.log_dir}")
            time.sleep(0.25)
        raise TimeoutError(f"Spark: not ready after {timeout_s:.0f}s: {what}; see {self.log_dir}")


def _get_json(url: str, timeout_s: float) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        data = json.loads(exc.read() or b"{}")
    return data if isinstance(data, dict) else {}


def _stop_group(proc: subprocess.Popen[bytes] | None, kill: bool = False) -> None:
    """Signal the process group this module started (its leader is `proc`), then reap it."""
    if proc is None:
        return
    pgid = proc.pid  # start_new_session=True: the child leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL if kill else signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=20)
    # Children (drivers, executors, python workers) may outlive the leader: finish the group.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def wait_free(port: int, timeout_s: float) -> None:
    """Block until nothing accepts connections on 127.0.0.1:port."""
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.3):
                time.sleep(0.2)
        except OSError:
            return
    raise TimeoutError(f"port {port} still in use after {timeout_s:.0f}s")


def start_cluster(
    *, cores: int = 4, memory: str = "4g", base_dir: Path | None = None, python: str | None = None
) -> SparkCluster:
    """Start a master and a worker on free loopback ports; returns when jobs can be submitted."""
    if not java_ok():
        raise RuntimeError(
            "Spark 4 needs Java 17 or newer on PATH (Debian: apt-get install openjdk-17-jre-headless)"
        )
    owns = base_dir is None
    root = Path(tempfile.mkdtemp(prefix="spark-cluster-")) if base_dir is None else base_dir
    cluster = SparkCluster(
        base_dir=root,
        master_port=free_port(),
        rest_port=free_port(),
        master_ui_port=free_port(),
        worker_ui_port=free_port(),
        cores=cores,
        memory=memory,
        python=python or sys.executable,
        _owns_dir=owns,
    )
    try:
        cluster.start()
    except BaseException:
        cluster.cleanup()
        raise
    return cluster


if __name__ == "__main__":  # manual use: python -m devstack.spark_cluster

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _exit)  # SIGTERM also runs the cleanup below
    spark = start_cluster()
    print(json.dumps({**spark.env(), "ui": spark.ui_url, "logs": str(spark.log_dir)}, indent=2), flush=True)
    try:
        while True:
            signal.pause()
    finally:
        spark.cleanup()
