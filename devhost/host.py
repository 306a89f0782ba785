"""Wires the indexed functions to queue listeners, the HTTP server and timers; start and stop.

The functions themselves run in the worker process (devhost.supervisor, devhost.worker).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from devhost.config import ConfigError, HostOptions, resolve_setting_refs
from devhost.http_server import HttpApp, build_http_functions, make_server, serve_in_thread
from devhost.invoker import QueueOutput, resolve_queue_outputs, send_queue_outputs
from devhost.loader import FunctionSpec
from devhost.queue_listener import QueueListener, QueueTarget
from devhost.stats import Stats
from devhost.storage import QueueClients, resolve_queue_connection
from devhost.supervisor import Worker
from devhost.timers import TimerRunner

log = logging.getLogger("devhost")

_QUEUE_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?!-))*[a-z0-9]$")


def validate_queue_name(name: str, function: str) -> str:
    if not (3 <= len(name) <= 63) or not _QUEUE_NAME.match(name):
        raise ConfigError(
            f"function {function}: invalid queue name {name!r} (3-63 chars of a-z, 0-9 and single dashes)"
        )
    return name


def queue_target(spec: FunctionSpec, environ: dict[str, str]) -> QueueTarget:
    raw = str(spec.trigger.get("queueName", ""))
    name = validate_queue_name(resolve_setting_refs(raw, environ, f"function {spec.name}").lower(), spec.name)
    connection = spec.trigger.get("connection")
    resolve_queue_connection(connection, environ)  # fail at start-up, naming the missing setting
    outputs = resolve_queue_outputs(spec, environ)
    for out in outputs:
        validate_queue_name(out.queue_name, spec.name)
        resolve_queue_connection(out.connection, environ)
    return QueueTarget(spec, name, connection, outputs)


class Host:
    def __init__(
        self,
        worker: Worker,
        options: HostOptions,
        environ: dict[str, str],
        stats: Stats,
        port: int | None,
    ) -> None:
        self.worker = worker
        self.options = options
        self.specs = specs = worker.specs
        self.stats = stats
        stats.provide("worker", worker.snapshot)
        self.clients = QueueClients(environ)
        encoding = options.queues.message_encoding
        self.listeners = [
            QueueListener(queue_target(s, environ), options, self.clients, stats, worker, self.notify)
            for s in specs
            if s.kind == "queue"
        ]
        self.timers = []
        for spec in (s for s in specs if s.kind == "timer"):
            outputs = resolve_queue_outputs(spec, environ)
            self.timers.append(
                TimerRunner(spec, environ, stats, worker, self._output_sender(outputs) if outputs else None)
            )
        http_functions = build_http_functions(specs, environ)
        for fn in http_functions:
            for out in fn.outputs:
                resolve_queue_connection(out.connection, environ)
        self.http_app = HttpApp(
            http_functions,
            options.route_prefix,
            stats,
            self.clients,
            worker,
            encoding,
            self.notify,
        )
        self.server = make_server(self.http_app, port) if port is not None else None

    def _output_sender(self, outputs: list[QueueOutput]) -> Callable[[dict[str, list[bytes]]], int]:
        def send(bodies: dict[str, list[bytes]]) -> int:
            return send_queue_outputs(
                outputs, bodies, self.clients, self.options.queues.message_encoding, self.notify
            )

        return send

    @property
    def http_url(self) -> str | None:
        if self.server is None:
            return None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def notify(self, queue_name: str) -> None:
        """This host wrote to `queue_name`: wake the listeners watching it (SharedQueueWatcher)."""
        for listener in self.listeners:
            if listener.queue_name == queue_name:
                listener.wake()

    def start(self) -> None:
        if self.server is not None:
            serve_in_thread(self.server)
        for listener in self.listeners:
            listener.start()
        for timer in self.timers:
            timer.start()
        q = self.options.queues
        log.info(
            "host started: batchSize=%d newBatchThreshold=%d maxPollingInterval=%.1fs "
            "visibilityTimeout=%.1fs maxDequeueCount=%d messageEncoding=%s lease=%.0fs functionTimeout=%s "
            "worker threads=%d",
            q.batch_size, q.new_batch_threshold, q.max_polling_interval, q.visibility_timeout,
            q.max_dequeue_count, q.message_encoding, self.options.lease_seconds,
            self.options.function_timeout, self.worker.threads,
        )  # fmt: skip
        for listener in self.listeners:
            log.info("queue trigger %s -> queue '%s'", listener.spec.name, listener.queue_name)

    def stop(self, grace: float = 30.0) -> bool:
        """Stop polling and timers, wait for in-flight invocations (up to `grace` s), stop HTTP and
        the worker process."""
        deadline = time.monotonic() + grace
        for listener in self.listeners:
            listener.stop_polling()
        for timer in self.timers:
            timer.stop()
        idle = all([listener.wait_idle(deadline) for listener in self.listeners])
        idle = all([timer.wait_idle(deadline) for timer in self.timers]) and idle
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.worker.stop()
        if not idle:
            log.error("shutdown: invocations still running after %.0fs; exiting anyway", grace)
        return idle
