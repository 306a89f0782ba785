"""Queue trigger listener: polling, lease renewal, poison handling, completion (QueueListener.cs)."""

from __future__ import annotations

import concurrent.futures
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from azure.storage.queue import QueueMessage

from devhost import decisions
from devhost.config import HostOptions
from devhost.decisions import Action, RenewOutcome
from devhost.invoker import QueueOutput, send_queue_outputs
from devhost.ipc import FunctionTimeout, error_text, failure_details
from devhost.loader import FunctionSpec
from devhost.queue_ops import (
    delete_message,
    error_info,
    receive_batch,
    release_message,
    renew_message,
    send_create_if_missing,
)
from devhost.scheduler import Scheduled, Scheduler
from devhost.stats import QUEUE_COUNTERS, Stats
from devhost.storage import QueueClients
from devhost.supervisor import Worker

log = logging.getLogger("devhost.queue")


@dataclass(frozen=True)
class QueueTarget:
    """A queue-triggered function with its resolved (lower-cased) queue name."""

    spec: FunctionSpec
    queue_name: str
    connection: str | None
    outputs: list[QueueOutput] = field(default_factory=list)


def _utc(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def queue_payload(message: QueueMessage, body: bytes) -> tuple[Any, ...]:
    """The trigger metadata the host sends the worker; it builds azure.functions.queue.QueueMessage
    (id, body, dequeue_count, expiration_time, insertion_time, time_next_visible, pop_receipt)."""
    return (
        message.id,
        body,
        int(message.dequeue_count or 0),
        _utc(message.expires_on),
        _utc(message.inserted_on),
        _utc(message.next_visible_on),
        message.pop_receipt,
    )


class Invocation:
    """A received message while this host owns it. Exactly one party `claim`s it to complete it."""

    def __init__(self, message: QueueMessage, lease: float) -> None:
        self.message = message
        self.message_id = str(message.id)
        self.raw_text = "" if message.content is None else str(message.content)
        self.dequeue_count = int(message.dequeue_count or 0)
        self.pop_receipt = str(message.pop_receipt)
        self.lock = threading.Lock()
        self.finished = False
        self.renew_interval = lease / 2
        self.renew_timer: Scheduled | None = None

    def claim(self) -> bool:
        """Take ownership of completion; stops renewal. False if someone already completed it."""
        with self.lock:
            if self.finished:
                return False
            self.finished = True
            if self.renew_timer is not None:
                self.renew_timer.cancel()
            return True


class QueueListener:
    def __init__(
        self,
        target: QueueTarget,
        options: HostOptions,
        clients: QueueClients,
        stats: Stats,
        worker: Worker,
        notify: Callable[[str], None],
        rng: random.Random | None = None,
    ) -> None:
        self.target = target
        self.spec = target.spec
        self.queue_name = target.queue_name
        self.poison_name = decisions.poison_queue_name(target.queue_name)
        self.opts = options.queues
        self.lease = options.lease_seconds
        self.clients = clients
        self.queue = clients.queue(target.connection, target.queue_name)
        self.worker = worker
        self.notify = notify
        self.rng = rng or random.Random()
        self.counters = stats.section("queues", target.queue_name, QUEUE_COUNTERS, function=self.spec.name)
        self.counters.gauges["in_flight"] = lambda: self.in_flight
        self._next_poll_at = 0.0
        self.counters.gauges["next_poll_in_s"] = self._next_poll_in
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.opts.max_in_flight, thread_name_prefix=f"fn-{self.spec.name}"
        )
        self.timers = Scheduler(f"timers-{self.queue_name}")
        self._cond = threading.Condition()
        self._in_flight = 0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._poll_error: tuple[Any, ...] | None = None
        self._thread = threading.Thread(target=self._poll_loop, name=f"poll-{self.queue_name}", daemon=True)

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    def _next_poll_in(self) -> float:
        return round(max(0.0, self._next_poll_at - time.monotonic()), 3)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """A write by this host to the queue: end the current backoff wait early."""
        self.counters.incr("wakes")
        self._wake.set()

    def stop_polling(self) -> None:
        self._stopping.set()
        self._wake.set()
        with self._cond:
            self._cond.notify_all()

    def wait_idle(self, deadline: float) -> bool:
        """Wait until no invocation is in flight (or the monotonic deadline passes)."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            while self._in_flight > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        self.pool.shutdown(wait=False)
        return True

    # --- polling ------------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        state = decisions.Backoff()
        found_since_last_delay = False
        while not self._stopping.is_set():
            with self._cond:
                while self._in_flight > self.opts.new_batch_threshold and not self._stopping.is_set():
                    self._cond.wait()
            if self._stopping.is_set():
                break
            self._wake.clear()
            batch = self._receive()
            if batch:
                found_since_last_delay = True
                for message in batch:
                    with self._cond:
                        self._in_flight += 1
                    self.pool.submit(self._process, message)
                continue
            delay, state = decisions.next_poll_delay(
                state, found_since_last_delay, self.opts.max_polling_interval, self.rng.uniform
            )
            found_since_last_delay = False
            self._next_poll_at = time.monotonic() + delay
            self._wake.wait(delay)
            self._next_poll_at = 0.0

    def _receive(self) -> list[QueueMessage]:
        self.counters.incr("polls")
        try:
            batch = receive_batch(self.queue, self.opts.batch_size, self.lease)
        except Exception as exc:
            self.counters.incr("poll_errors")
            status, code = error_info(exc)
            signature = (status, code, type(exc).__name__)
            if signature != self._poll_error:  # log once per kind of error, not per poll
                self._poll_error = signature
                if status == 404 and code == "QueueNotFound":
                    log.warning("queue '%s' does not exist (yet); polling it with backoff", self.queue_name)
                elif decisions.is_empty_poll_error(status, code):
                    log.warning("polling queue '%s' failed (%s %s): %s; backing off", self.queue_name,
                                status, code, str(exc).splitlines()[0])  # fmt: skip
                else:  # the real host would stop here; a dev host keeps trying
                    log.error("polling queue '%s' failed with an unexpected error (%s %s): %s",
                              self.queue_name, status, code, str(exc).splitlines()[0])  # fmt: skip
            return []
        if self._poll_error is not None:
            log.info("queue '%s' is reachable again", self.queue_name)
            self._poll_error = None
        if not batch:
            self.counters.incr("empty_polls")
        self.counters.incr("received", len(batch))
        return batch

    # --- one message --------------------------------------------------------------------------

    def _process(self, message: QueueMessage) -> None:
        inv = Invocation(message, self.lease)
        try:
            self._run(inv)
        except Exception:
            log.exception("unexpected error processing message %s from '%s'", inv.message_id, self.queue_name)
            if inv.claim():
                self._done()

    def _run(self, inv: Invocation) -> None:
        has_poison = self.poison_name is not None
        action = decisions.before_call(inv.dequeue_count, self.opts.max_dequeue_count, has_poison)
        if action is not Action.CALL:
            if inv.claim():
                why = f"dequeue count {inv.dequeue_count} > maxDequeueCount {self.opts.max_dequeue_count}"
                self._finish(inv, action, why)
            return
        body = decisions.decode_body(inv.raw_text, self.opts.message_encoding)
        if body is None:
            self.counters.incr("undecodable")
            if inv.claim():
                self._finish(inv, decisions.after_undecodable(has_poison), "message is not valid base64")
            return

        with inv.lock:
            inv.renew_timer = self._timer(inv.renew_interval, self._renew, inv)
        invocation_id = str(uuid.uuid4())
        log.info("Executing 'Functions.%s' (Reason='New queue message detected on '%s'.', Id=%s, "
                 "MessageId=%s, DequeueCount=%d)", self.spec.name, self.queue_name, invocation_id,
                 inv.message_id, inv.dequeue_count)  # fmt: skip
        self.counters.incr("invocations")
        started = time.monotonic()
        error: Exception | None = None
        try:
            outcome = self.worker.invoke(self.spec.name, invocation_id, queue_payload(inv.message, body))
            sent = send_queue_outputs(self.target.outputs, outcome.queue_outputs, self.clients,
                                      self.opts.message_encoding, self.notify)  # fmt: skip
            self.counters.incr("output_messages", sent)
        except Exception as exc:
            error = exc
        inv.claim()
        elapsed_ms = (time.monotonic() - started) * 1000
        if error is None:
            self.counters.incr("successes")
            log.info("Executed 'Functions.%s' (Succeeded, Id=%s, Duration=%.0fms)",
                     self.spec.name, invocation_id, elapsed_ms)  # fmt: skip
        else:
            self.counters.incr("failures")
            if isinstance(error, FunctionTimeout):
                self.counters.incr("timeouts")
            log.error("Executed 'Functions.%s' (Failed, Id=%s, Duration=%.0fms, DequeueCount=%d): %s%s",
                      self.spec.name, invocation_id, elapsed_ms, inv.dequeue_count, error_text(error),
                      failure_details(error))  # fmt: skip
        action = decisions.after_call(
            error is None, inv.dequeue_count, self.opts.max_dequeue_count, has_poison
        )
        self._finish(inv, action, "function failed")

    def _timer(self, delay: float, fn: Callable[[Invocation], None], inv: Invocation) -> Scheduled:
        return self.timers.call_later(delay, fn, inv)

    def _renew(self, inv: Invocation) -> None:
        with inv.lock:
            if inv.finished:
                return
            try:
                inv.pop_receipt = renew_message(self.queue, inv.message_id, inv.pop_receipt, self.lease)
                outcome = RenewOutcome.OK
                self.counters.incr("renewals")
                log.debug("renewed lease of message %s on '%s'", inv.message_id, self.queue_name)
            except Exception as exc:
                status, code = error_info(exc)
                outcome = decisions.classify_renew_error(status)
                self.counters.incr("renewal_errors")
                log.warning("lease renewal of message %s on '%s' failed (%s %s): %s", inv.message_id,
                            self.queue_name, status, code, str(exc).splitlines()[0])  # fmt: skip
            interval = decisions.next_renewal_interval(inv.renew_interval, outcome, self.lease)
            if interval is None:
                self.counters.incr("renewals_lost")
                log.warning(
                    "stopped renewing message %s on '%s': ownership lost", inv.message_id, self.queue_name
                )
                return
            inv.renew_interval = interval
            inv.renew_timer = self._timer(interval, self._renew, inv)

    # --- completion ---------------------------------------------------------------------------

    def _finish(self, inv: Invocation, action: Action, why: str) -> None:
        try:
            self._complete(inv, action, why)
        except Exception as exc:
            self.counters.incr("storage_errors")
            log.error("completing message %s on '%s' (%s) failed: %s", inv.message_id, self.queue_name,
                      action.value, exc, exc_info=exc)  # fmt: skip
        finally:
            self._done()

    def _done(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def _delete(self, inv: Invocation) -> None:
        if delete_message(self.queue, inv.message_id, inv.pop_receipt):
            self.counters.incr("deletes")
        else:
            self.counters.incr("deletes_ignored")

    def _complete(self, inv: Invocation, action: Action, why: str) -> None:
        if action is Action.DELETE:
            self._delete(inv)
        elif action is Action.RELEASE:
            if release_message(self.queue, inv.message_id, inv.pop_receipt, self.opts.visibility_timeout):
                self.counters.incr("releases")
            else:
                self.counters.incr("releases_ignored")
        elif action is Action.POISON:
            assert self.poison_name is not None
            log.warning("Message %s on '%s' (%s; dequeue count %d, maxDequeueCount %d). Moving message to "
                        "queue '%s'.", inv.message_id, self.queue_name, why, inv.dequeue_count,
                        self.opts.max_dequeue_count, self.poison_name)  # fmt: skip
            poison = self.clients.queue(self.target.connection, self.poison_name)
            send_create_if_missing(poison, inv.raw_text)
            self.counters.incr("poison_moves")
            self.notify(self.poison_name)
            self._delete(inv)
        elif action is Action.LEAVE:
            self.counters.incr("left_leased")
            log.warning("message %s on '%s' (%s): queue has no poison queue; left invisible until its lease "
                        "expires (%.0fs)", inv.message_id, self.queue_name, why, self.lease)  # fmt: skip
