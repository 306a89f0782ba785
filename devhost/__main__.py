"""`python -m devhost --app-dir DIR [--port 7071] [--no-http] [--settings FILE] [--instance-id NAME]
[--count-requests]`: run a v2-model Python function app like `func start` would."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from types import FrameType

from devhost.config import (
    ConfigError,
    apply_settings,
    load_host_options,
    load_settings_values,
    settings_http_port,
    sync_thread_count,
)
from devhost.host import Host
from devhost.logs import setup_logging
from devhost.stats import Stats
from devhost.storage import RequestCounter
from devhost.supervisor import Worker, WorkerStartError

SHUTDOWN_GRACE_SECONDS = 30.0
DEFAULT_PORT = 7071


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devhost", description=__doc__)
    parser.add_argument(
        "--app-dir", required=True, type=Path, help="folder with function_app.py and host.json"
    )
    parser.add_argument("--port", type=int, default=None, help="HTTP port on 127.0.0.1 (0 = a free port)")
    parser.add_argument("--no-http", action="store_true", help="do not serve HTTP triggers")
    parser.add_argument(
        "--settings", type=Path, default=None, help="default: DIR/local.settings.json if present"
    )
    parser.add_argument("--instance-id", default=None, help="name shown in logs and stats")
    parser.add_argument("--count-requests", action="store_true", help="count storage HTTP requests (stats)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    app_dir: Path = args.app_dir.resolve()
    instance_id = args.instance_id or f"{socket.gethostname()}-{os.getpid()}"
    try:
        settings = args.settings.resolve() if args.settings else app_dir / "local.settings.json"
        if args.settings is not None and not settings.is_file():
            raise ConfigError(f"settings file not found: {settings}")
        settings_port = None
        if settings.is_file():
            apply_settings(load_settings_values(settings), os.environ)
            settings_port = settings_http_port(settings)
        else:
            apply_settings({}, os.environ)
        options = load_host_options(app_dir, os.environ)
        threads = sync_thread_count(os.environ)
        setup_logging(instance_id, options.log_level)
        counter = None
        if args.count_requests:
            counter = RequestCounter(os.environ)
            counter.install()
        os.chdir(app_dir)  # like func start: the worker runs in the app folder
        port = (
            None if args.no_http else (args.port if args.port is not None else settings_port or DEFAULT_PORT)
        )
    except ConfigError as exc:
        print(f"devhost: error: {exc}", file=sys.stderr, flush=True)
        return 2
    worker = Worker(app_dir, threads, options.function_timeout, instance_id, options.log_level, counter)
    try:
        worker.start()  # the worker imports function_app.py and indexes it
        host = Host(worker, options, dict(os.environ), Stats(instance_id, counter), port)
    except ConfigError as exc:
        worker.stop()
        print(f"devhost: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except WorkerStartError as exc:
        worker.stop()
        print(f"devhost: error: the function app failed to load in the worker process:\n{exc}",
              file=sys.stderr, flush=True)  # fmt: skip
        return 1
    except Exception:
        worker.stop()
        print("devhost: error: start-up failed (HTTP port?):", file=sys.stderr)
        traceback.print_exc()
        return 1

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("devhost").info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    host.start()
    names = ",".join(spec.name for spec in worker.specs)
    print(f"devhost ready http={host.http_url or 'none'} functions={names}", flush=True)
    while not stop.wait(0.5):
        pass
    idle = host.stop(SHUTDOWN_GRACE_SECONDS)
    logging.getLogger("devhost").info("stopped")
    if not idle:
        logging.getLogger("devhost").warning("exiting with invocations still running")
    return 0


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads of unfinished HTTP requests or timers cannot be joined: leave without them.
    os._exit(code)
