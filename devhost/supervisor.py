"""The host's side of the language worker: start it, send it invocations, restart it.

Like the real host: on a function timeout the worker process is restarted, and every invocation
in flight in it fails; a worker that dies by itself is restarted the same way. The old process
is killed (SIGTERM, then SIGKILL after a short grace) before the invocations are failed, so none
of its work can land after its messages were released. The new worker indexes the app again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devhost.config import ConfigError, format_timespan
from devhost.ipc import Channel, FunctionTimeout, Outcome, WorkerGone, outcome_from
from devhost.loader import FunctionSpec, spec_from_description
from devhost.scheduler import Scheduled, Scheduler
from devhost.storage import RequestCounter

log = logging.getLogger("devhost.worker")

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
BOOTSTRAP = "import sys; sys.path.insert(0, sys.argv.pop(1)); from devhost.worker import run; run()"
START_TIMEOUT_SECONDS = 60.0
KILL_GRACE_SECONDS = 1.0
RESTART_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)  # between failed starts of a replacement worker


class WorkerStartError(Exception):
    """The worker process could not import or index the app; the message has its traceback."""


def describe_exit(code: int | None) -> str:
    """A process exit status in words: 'exit code 3', 'killed by SIGKILL'."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class Call:
    """One invocation sent to a worker and not yet come back."""

    function: str
    invocation_id: str
    future: concurrent.futures.Future[Outcome] = field(default_factory=concurrent.futures.Future)
    timer: Scheduled | None = None


class WorkerProcess:
    """One worker child process, its pipe, and the calls in flight in it."""

    def __init__(self, proc: subprocess.Popen[bytes], generation: int) -> None:
        assert proc.stdout is not None and proc.stdin is not None
        self.proc = proc
        self.channel = Channel(proc.stdout, proc.stdin)  # type: ignore[arg-type]
        self.generation = generation
        self.pending: dict[int, Call] = {}
        self.timed_out: set[int] = set()  # calls past functionTimeout (they fail as timeouts)
        self.ready = threading.Event()
        self.specs: list[FunctionSpec] = []
        self.start_error: tuple[str, str] | None = None  # ("config" | "import", text)
        self.accepted = False  # became the host's current worker
        self.exited = False  # its pipe reached EOF
        self.retiring = False  # being restarted or stopped: its calls are failed by whoever did that

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close_input(self) -> None:
        """Close the host's end of the pipe to the worker (its output is closed by the reader)."""
        with contextlib.suppress(OSError):
            self.channel.close_writer()


class Worker:
    """The worker process of this host, replaced after a timeout or a crash."""

    def __init__(
        self,
        app_dir: Path,
        threads: int,
        function_timeout: float | None,
        instance_id: str,
        log_level: int,
        counter: RequestCounter | None = None,
    ) -> None:
        self.app_dir = app_dir
        self.threads = threads
        self.function_timeout = function_timeout
        self.instance_id = instance_id
        self.log_level = log_level
        self.counter = counter
        self.specs: list[FunctionSpec] = []
        self.restarts = 0
        self.timeouts = 0
        self.crashes = 0
        self._cond = threading.Condition()
        self._current: WorkerProcess | None = None
        self._unavailable: str | None = None  # why no worker is running (a replacement failed to start)
        self._stopping = threading.Event()
        self._seq = itertools.count(1)
        self._generation = itertools.count(1)
        self._timers = Scheduler("worker-timeouts")

    # --- start and stop -----------------------------------------------------------------------

    def start(self) -> list[FunctionSpec]:
        """Start the first worker and return the functions it indexed (ConfigError, WorkerStartError)."""
        wp = self._spawn()
        if not self._accept(wp):
            raise WorkerStartError(f"the worker process (pid {wp.pid}) exited right after start-up")
        self.specs = wp.specs
        log.info("worker process started (pid %d, %d threads for sync functions)", wp.pid, self.threads)
        return wp.specs

    def stop(self, grace: float = 5.0) -> None:
        """Close the pipe (the worker exits at once), wait `grace` s, kill it if needed."""
        self._stopping.set()
        with self._cond:
            wp, self._current = self._current, None
            calls = self._retire(wp) if wp is not None else {}
            self._cond.notify_all()
        if wp is not None:
            wp.close_input()  # the worker exits when it reads EOF
            with contextlib.suppress(subprocess.TimeoutExpired):
                wp.proc.wait(grace)
            self._kill(wp)
        self._fail(calls, set(), "the host is stopping")

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            wp = self._current
            return {
                "pid": wp.pid if wp is not None else None,
                "threads": self.threads,
                "in_flight": len(wp.pending) if wp is not None else 0,
                "restarts": self.restarts,
                "timeouts": self.timeouts,
                "crashes": self.crashes,
                "unavailable": self._unavailable,
            }

    # --- invocations --------------------------------------------------------------------------

    def invoke(self, function: str, invocation_id: str, payload: tuple[Any, ...]) -> Outcome:
        """Run `function` in the worker and wait; raises FunctionError (FunctionTimeout, WorkerGone)."""
        call = Call(function, invocation_id)
        with self._cond:
            while self._current is None and self._unavailable is None and not self._stopping.is_set():
                self._cond.wait()
            wp = self._current
            if wp is None:
                raise WorkerGone("WorkerUnavailable", self._unavailable or "the host is stopping")
            seq = next(self._seq)
            if self.function_timeout is not None:
                call.timer = self._timers.call_later(self.function_timeout, self._on_timeout, wp, seq)
            wp.pending[seq] = call
        with contextlib.suppress(OSError, ValueError):  # gone: whoever retires it fails this call
            wp.channel.send(("invoke", seq, function, invocation_id, payload))
        return call.future.result()

    def _complete(self, wp: WorkerProcess, message: tuple[Any, ...]) -> None:
        _, seq, result, requests = message
        if requests and self.counter is not None:
            self.counter.add(requests)
        with self._cond:
            call = wp.pending.pop(seq, None)
        if call is None:
            return  # already failed (timeout, restart)
        if call.timer is not None:
            call.timer.cancel()
        try:
            call.future.set_result(outcome_from(result))
        except Exception as exc:
            call.future.set_exception(exc)

    # --- the child process --------------------------------------------------------------------

    def _spawn(self) -> WorkerProcess:
        """Start a worker process and wait until it has indexed the app."""
        args = [sys.executable, "-c", BOOTSTRAP, str(PACKAGE_ROOT), "--app-dir", str(self.app_dir)]
        args += ["--threads", str(self.threads), "--instance-id", self.instance_id]
        args += ["--log-level", str(self.log_level)]
        if self.counter is not None:
            args.append("--count-requests")
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=self.app_dir)
        wp = WorkerProcess(proc, next(self._generation))
        reader = threading.Thread(
            target=self._read_loop, args=(wp,), name=f"worker-{wp.generation}", daemon=True
        )
        reader.start()
        if not wp.ready.wait(START_TIMEOUT_SECONDS):
            self._kill(wp)
            raise WorkerStartError(
                f"the worker process did not index the app in {START_TIMEOUT_SECONDS:.0f}s"
            )
        if wp.start_error is not None:
            self._kill(wp)
            kind, text = wp.start_error
            if kind == "config":
                raise ConfigError(text)
            raise WorkerStartError(text)
        return wp

    def _accept(self, wp: WorkerProcess) -> bool:
        """Make a started worker the current one, unless it has exited already."""
        with self._cond:
            if wp.exited or self._stopping.is_set():
                return False
            wp.accepted = True
            self._current = wp
            self._unavailable = None
            self._cond.notify_all()
            return True

    def _read_loop(self, wp: WorkerProcess) -> None:
        while True:
            try:
                message = wp.channel.recv()
            except Exception:  # EOF, a closed pipe, or a broken frame: the worker is done
                wp.channel.close_reader()
                break
            kind = message[0]
            if kind == "done":
                self._complete(wp, message)
            elif kind == "ready":
                wp.specs = [spec_from_description(d) for d in message[2]]
                wp.ready.set()
            elif kind == "error":
                wp.start_error = (str(message[1]), str(message[2]))
                wp.ready.set()
        self._on_exit(wp)

    def _on_exit(self, wp: WorkerProcess) -> None:
        try:
            code = wp.proc.wait(KILL_GRACE_SECONDS * 5)
        except subprocess.TimeoutExpired:
            code = None
        with self._cond:
            wp.exited = True
            if wp.start_error is None and not wp.ready.is_set():
                wp.start_error = (
                    "import",
                    f"the worker process ended during start-up ({describe_exit(code)})",
                )
            wp.ready.set()
            unexpected = wp.accepted and not wp.retiring
            if unexpected:
                self.crashes += 1
        if unexpected:
            log.error("The worker process (pid %d) exited unexpectedly (%s).", wp.pid, describe_exit(code))
            self._restart(wp, f"it exited unexpectedly ({describe_exit(code)})")

    def _kill(self, wp: WorkerProcess, grace: float = KILL_GRACE_SECONDS) -> None:
        """SIGTERM, then SIGKILL after `grace` s; returns once the process is gone."""
        proc = wp.proc
        if proc.poll() is None and grace > 0:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        wp.close_input()

    # --- timeouts and restarts ----------------------------------------------------------------

    def _on_timeout(self, wp: WorkerProcess, seq: int) -> None:
        with self._cond:
            call = wp.pending.get(seq)
            if call is None:
                return
            wp.timed_out.add(seq)
            self.timeouts += 1
        assert self.function_timeout is not None
        log.error("Timeout value of %s exceeded by function 'Functions.%s' (Id: '%s'). Initiating "
                  "cancellation.", format_timespan(self.function_timeout), call.function,
                  call.invocation_id)  # fmt: skip
        self._restart(wp, f"function 'Functions.{call.function}' timed out")

    def _retire(self, wp: WorkerProcess) -> dict[int, Call]:
        """Under the lock: mark `wp` as going away and take its calls in flight."""
        wp.retiring = True
        calls, wp.pending = wp.pending, {}
        if self._current is wp:
            self._current = None
        return calls

    def _restart(self, wp: WorkerProcess, reason: str) -> None:
        with self._cond:
            if wp.retiring:
                return
            calls = self._retire(wp)
            timed_out = set(wp.timed_out)
            self.restarts += 1
        log.error("Restarting the worker process (pid %d): %s. %d invocation(s) in flight in it fail "
                  "(%d timed out).", wp.pid, reason, len(calls), len(calls.keys() & timed_out))  # fmt: skip
        self._kill(wp)
        self._fail(calls, timed_out, f"the worker process was restarted: {reason}")
        self._replace()

    def _fail(self, calls: dict[int, Call], timed_out: set[int], reason: str) -> None:
        for seq, call in calls.items():
            if call.timer is not None:
                call.timer.cancel()
            if seq in timed_out and self.function_timeout is not None:
                span = format_timespan(self.function_timeout)
                error: Exception = FunctionTimeout(
                    "FunctionTimeoutException",
                    f"Timeout value of {span} was exceeded by function: Functions.{call.function}",
                )
            else:
                error = WorkerGone("WorkerProcessRestarted", reason)
            call.future.set_exception(error)

    def _replace(self) -> None:
        """Start a new worker (retrying with growing delays) unless the host is stopping."""
        for attempt in itertools.count():
            if self._stopping.is_set():
                return
            try:
                wp = self._spawn()
            except (ConfigError, WorkerStartError) as exc:
                delay = RESTART_DELAYS[min(attempt, len(RESTART_DELAYS) - 1)]
                log.error("A new worker process could not start: %s\nRetrying in %.0fs.", exc, delay)
                with self._cond:
                    self._unavailable = f"no worker process: {str(exc).strip().splitlines()[-1]}"
                    self._cond.notify_all()
                self._stopping.wait(delay)
                continue
            if not self._accept(wp):
                self._kill(wp)
                continue
            names = [s.name for s in wp.specs]
            if names != [s.name for s in self.specs]:
                log.warning("the restarted worker indexed other functions (%s); the host keeps the bindings "
                            "it started with", ",".join(names))  # fmt: skip
            log.info("worker process restarted (pid %d); functions indexed again", wp.pid)
            return
