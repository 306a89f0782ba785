"""A deterministic world for the app: fake clock, queues with the Functions host's semantics,
in-memory stores, and one injected fault at a chosen storage call.

The app's own code (processing, poison handler, sweeper, replay) runs unchanged on top of it;
only the storage and the host are simulated. Host rules follow
../shared/reference/functions-queue-host.md: a received message is leased for 10 minutes and
renewed while the function runs; a failure releases it for `visibilityTimeout`, or moves a copy
to `<queue>-poison` at `maxDequeueCount`; a `-poison` queue has no poison queue; a crashed worker
leaves its message leased until the lease ends.
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import itertools
import json
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from azure.core.exceptions import ServiceResponseError

from shared.config.settings import HOST_JSON, Settings, parse_timespan
from shared.core.documents import Conflict
from shared.core.envelope import best_effort_id, decode_message
from shared.core.errors import DownstreamUnavailable, InputDataError, PayloadError
from shared.jobs.base import Completed, Continue, JobContext, Outcome
from shared.ledger import Ledger, lease_end
from shared.ledger.view import index_tags
from shared.pipeline.processing import process_message
from shared.pipeline.recovery import recover_claims
from shared.poison import handle_poison_message, sweep
from shared.runtime.wiring import Runtime, indexes
from shared.storage.failures import StorageBusy
from shared.storage.memory_documents import MemoryDocuments
from shared.storage.memory_tables import MemoryTables
from shared.storage.ports import Account

START = datetime(2026, 1, 1, tzinfo=UTC)
HOST_LEASE_S = 600.0  # the real host's fixed message lease
SWEEP_EVERY_S = 900.0  # the sweep_poison timer as shipped (every 15 minutes)


class SimCrash(BaseException):
    """The worker process dies here (not an Exception: nothing in the app may catch it)."""


class SimWorkerDied(BaseException):
    """A job's run kills its worker process (a segfault, `os._exit`): the host lives on, restarts
    the worker and fails the invocation, so its message comes back after `visibilityTimeout`."""


# -- clock and timers -------------------------------------------------------------------------


class FakeClock:
    """Simulated time; timers fire when time is advanced past them."""

    def __init__(self) -> None:
        self.now = START
        self._heap: list[tuple[datetime, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def __call__(self) -> datetime:
        return self.now

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> _FakeTimer:
        timer = _FakeTimer(fn)
        heapq.heappush(self._heap, (self.now + timedelta(seconds=delay_s), next(self._seq), timer))
        return timer

    def next_due(self) -> datetime | None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def advance_to(self, moment: datetime) -> None:
        """Move time forward, firing due timers in order (a timer may schedule another)."""
        while True:
            due = self.next_due()
            if due is None or due > moment:
                break
            _, _, timer = heapq.heappop(self._heap)
            self.now = max(self.now, due)
            timer.cancelled = True
            timer.fn()
        self.now = max(self.now, moment)

    def sleep(self, seconds: float) -> None:
        self.advance_to(self.now + timedelta(seconds=seconds))

    def cancel_all(self) -> None:
        """A worker crash: its timers (heartbeats) die with it."""
        for _, _, timer in self._heap:
            timer.cancelled = True
        self._heap.clear()

    def pending(self) -> int:
        return sum(1 for _, _, t in self._heap if not t.cancelled)


class _FakeTimer:
    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


# -- faults -----------------------------------------------------------------------------------

FAULT_KINDS = ("crash", "error", "lost")
"""crash: the worker dies before the call; error: the call fails unapplied; lost: the call is
applied but its answer is lost (the caller sees an error)."""


@dataclass
class Faults:
    """Counts storage calls; injects a fault at call number `at` (1-based), and at the `burst - 1`
    calls after it. With `only`, calls are counted only when their label starts with it."""

    at: int | None = None
    kind: str = "error"
    burst: int = 1
    only: str | None = None
    calls: list[str] = field(default_factory=list)
    injected: str | None = None
    injections: int = 0
    gate: Callable[[], None] | None = None
    """Called at every storage call before anything else (the interleaving scheduler's yield point)."""
    clock: Callable[[], datetime] | None = None
    injected_at: datetime | None = None

    def before(self, op: str, name: str) -> Callable[[], None] | None:
        if self.gate is not None:
            self.gate()
        label = f"{op} {name}"
        if self.only is None or label.startswith(self.only):
            self.calls.append(label)
        else:
            return None
        if self.at is None or not self.at <= len(self.calls) < self.at + self.burst:
            return None
        self.injections += 1
        if self.injected is None:
            self.injected = f"{self.kind} at call {self.at}: {label}" + (
                f" (x{self.burst})" if self.burst > 1 else ""
            )
            self.injected_at = self.clock() if self.clock else None
        if self.kind == "crash":
            raise SimCrash(self.injected)
        if self.kind == "error":
            raise ServiceResponseError(f"simulated storage error ({op})")
        return _lose_answer


@contextlib.contextmanager
def as_port(op: str) -> Iterator[None]:
    """A queue call's injected failure as the `Queue` port raises it (shared.storage.azure_queues
    translates the SDK's): StorageBusy, no answer."""
    try:
        yield
    except ServiceResponseError as exc:
        raise StorageBusy(f"{op}: storage busy (ServiceResponseError)", answered=False) from exc


def _lose_answer() -> None:
    raise ServiceResponseError("simulated: applied, but the answer was lost")


# -- queues -----------------------------------------------------------------------------------


@dataclass
class SimMessage:
    id: str
    content: str
    dequeue_count: int
    inserted_on: datetime
    visible_at: datetime
    pop_receipt: str = ""

    @property
    def next_visible_on(self) -> datetime:
        return self.visible_at


class SimQueue:
    """A storage queue. `send_message` and the peek/receive/delete calls match QueueClient's."""

    def __init__(
        self, name: str, clock: FakeClock, faults: Faults, encode_base64: bool, jobs_of: dict[str, str | None]
    ) -> None:
        self.name = name
        self.jobs_of = jobs_of
        self.clock = clock
        self.faults = faults
        self.encode_base64 = encode_base64
        self.messages: dict[str, SimMessage] = {}
        self._lock = threading.Lock()

    def send_message(
        self, content: Any, *, visibility_timeout: int | None = None, time_to_live: int | None = None
    ) -> SimMessage:
        with as_port("send"):
            after = self.faults.before("queue.send", self.name)
            text = str(content)
            if self.encode_base64:
                text = base64.b64encode(text.encode("utf-8")).decode("ascii")
            msg = self.put(text, visibility_timeout or 0)
            if after:
                after()
            return msg

    def put(self, text: str, delay_s: float = 0.0) -> SimMessage:
        now = self.clock()
        msg = SimMessage(uuid.uuid4().hex, text, 0, now, now + timedelta(seconds=delay_s))
        self.jobs_of[msg.id] = best_effort_id(decode_message(text.encode("utf-8")))
        with self._lock:
            self.messages[msg.id] = msg
        return msg

    def visible(self) -> list[SimMessage]:
        now = self.clock()
        return sorted(
            (m for m in self.messages.values() if m.visible_at <= now),
            key=lambda m: (m.visible_at, m.inserted_on, m.id),
        )

    def next_visible_at(self) -> datetime | None:
        return min((m.visible_at for m in self.messages.values()), default=None)

    def take(self, msg: SimMessage, lease_s: float) -> SimMessage:
        """Receive one message (dequeue count + 1, invisible for the lease, new pop receipt)."""
        msg.dequeue_count += 1
        msg.visible_at = self.clock() + timedelta(seconds=lease_s)
        msg.pop_receipt = uuid.uuid4().hex
        return msg

    def peek_messages(self, max_messages: int | None = 32) -> list[Any]:
        with as_port("peek"):
            self.faults.before("queue.peek", self.name)
        return self.visible()[: max_messages or 32]

    def receive_messages(
        self, *, max_messages: int | None = 32, visibility_timeout: int | None = 30
    ) -> Iterator[SimMessage]:
        with as_port("receive"):
            self.faults.before("queue.receive", self.name)
        batch = [self.take(m, visibility_timeout or 30) for m in self.visible()[: max_messages or 32]]
        yield from batch

    def delete_message(self, msg: Any) -> None:
        with as_port("delete"):
            after = self.faults.before("queue.delete", self.name)
            with self._lock:
                current = self.messages.get(msg.id)
                if current is not None and current.pop_receipt == msg.pop_receipt:
                    del self.messages[msg.id]
            if after:
                after()


@dataclass(frozen=True)
class Delivered:
    """What the host hands a queue function."""

    id: str | None
    dequeue_count: int | None
    body: bytes
    insertion_time: datetime | None = None

    def get_body(self) -> bytes:
        return self.body


# -- the job kind the simulation runs ---------------------------------------------------------


class SimHandler:
    """`sim`: applies one idempotent effect per job, after failing as the payload asks.

    transient: n        -> DownstreamUnavailable while attempt < n
    unexpected_once     -> RuntimeError on the job's first execution only
    unexpected_always   -> RuntimeError every time (the host's retries, then poison)
    permanent_until_fix -> InputDataError until the world's `fixed` flag is set (then replay)
    polls: n            -> offloaded: Continue n times, then the effect
    work_s: s           -> the work takes s seconds of simulated time (heartbeats run meanwhile)
    dies                -> the run kills its worker process, every time (SimWorkerDied)
    """

    def __init__(self, world: World) -> None:
        self.world = world

    def validate(self, payload: Mapping[str, Any]) -> None:
        known = {
            "transient",
            "unexpected_once",
            "unexpected_always",
            "permanent_until_fix",
            "polls",
            "work_s",
            "dies",
        }
        if set(payload) - known:
            raise PayloadError([f"payload.{k}: unknown field" for k in sorted(set(payload) - known)])

    def run(self, ctx: JobContext) -> Outcome:
        world, payload = self.world, ctx.payload
        world.executions[ctx.job_id] = world.executions.get(ctx.job_id, 0) + 1
        if payload.get("work_s"):
            world.clock.sleep(float(payload["work_s"]))
        if payload.get("dies"):
            raise SimWorkerDied(f"sim: run {world.executions[ctx.job_id]} of {ctx.job_id} kills its worker")
        if payload.get("unexpected_always") or (
            payload.get("unexpected_once") and world.executions[ctx.job_id] == 1
        ):
            raise RuntimeError("sim: unexpected failure")
        if payload.get("permanent_until_fix") and not world.fixed:
            raise InputDataError("sim: input is bad until fixed")
        if ctx.attempt < int(payload.get("transient", 0)):
            raise DownstreamUnavailable(f"sim: transient failure at attempt {ctx.attempt}")
        polls = int(payload.get("polls", 0))
        if polls:
            done = int((ctx.resume_state or {}).get("polls", -1)) + 1
            if done < polls:
                return Continue(state={"polls": done}, delay_s=5)
        world.apply_effect(ctx.job_id)
        return Completed(result_ref="", summary={"attempt": ctx.attempt})


# -- the world --------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostRules:
    """The host's queue settings: the shipped host.json's, and the real host's fixed lease."""

    visibility_timeout_s: float
    max_dequeue_count: int
    message_encoding: str = "base64"
    lease_s: float = HOST_LEASE_S

    @classmethod
    def shipped(cls) -> HostRules:
        queues = json.loads(HOST_JSON.read_text())["extensions"]["queues"]
        return cls(
            parse_timespan(queues["visibilityTimeout"]),
            int(queues["maxDequeueCount"]),
            str(queues.get("messageEncoding", "base64")),
        )


class World:
    """Everything one schedule runs in."""

    def __init__(self, faults: Faults, settings_env: Mapping[str, str] | None = None) -> None:
        self.clock = FakeClock()
        self.faults = faults
        faults.clock = self.clock
        self.rules = HostRules.shipped()
        env = {"AzureWebJobsStorage": "UseDevelopmentStorage=true", **(settings_env or {})}
        self.settings = Settings.from_env(env)  # the defaults: what ships
        self.ledger_docs = MemoryDocuments(self.clock, faults.before, "ledger", tags=index_tags)
        self.archive_docs = MemoryDocuments(self.clock, faults.before, "archive")
        self.effects = MemoryDocuments(self.clock, faults.before, "effects")
        self.message_jobs: dict[str, str | None] = {}
        """Queue message id -> the job id in its body, for every message ever put."""
        self.jobs = SimQueue("jobs", self.clock, faults, True, self.message_jobs)
        self.poison = SimQueue("jobs-poison", self.clock, faults, False, self.message_jobs)
        self.executions: dict[str, int] = {}
        self.fixed = False
        self.crashes = 0
        self.expect_unparsed: tuple[bytes, ...] = ()
        """Bodies the scenario expects archived under unparsed/ (checked at the end)."""
        self.tables = MemoryTables(self.clock)
        """The indexes' tables (not faulted: index writes are best effort, the blobs the truth)."""
        job_index, entry_index, audit, counters = indexes(self.settings, self.tables, self.archive_docs)
        entry_index.ensure()
        self.rt = Runtime(
            settings=self.settings,
            account=cast(Account, None),
            handlers={"sim": SimHandler(self)},
            instance="sim",
            ledger=Ledger(self.ledger_docs),
            ledger_docs=self.ledger_docs,
            archive=self.archive_docs,
            jobs_queue=self.jobs,
            poison_queue=self.poison,
            job_index=job_index,
            entry_index=entry_index,
            audit=audit,
            counters=counters,
            clock=self.clock,
            timers=self.clock,
            sleep=self.clock.sleep,
        )
        self._next_sweep = self.clock() + timedelta(seconds=SWEEP_EVERY_S)
        self._next_recovery = self.clock() + timedelta(seconds=self.settings.recovery_interval_s)
        self.claims_at_crash: dict[str, datetime] = {}
        """Job id -> the end of its claim, for claims in progress at the first crash."""
        self.claim_ends: list[datetime] = []
        """The ends of the claims in progress at every crash."""
        self.recoveries = 0
        """Jobs re-sent by the recovery watch."""

    # -- what jobs do ------------------------------------------------------------------------

    def apply_effect(self, job_id: str) -> None:
        """The job's side effect, idempotent by job id (a re-run finds it there)."""
        with contextlib.suppress(Conflict):
            self.effects.create(f"{job_id}.json", {"job_id": job_id, "at": self.clock().isoformat()})

    def effect_applied(self, job_id: str) -> bool:
        return f"{job_id}.json" in self.effects.docs

    def submit(self, body: Mapping[str, Any] | bytes, delay_s: float = 0.0) -> None:
        """A producer's message, base64-encoded (not a storage call of the app under test)."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.jobs.put(base64.b64encode(raw).decode("ascii"), delay_s)

    def put_text(self, text: str, delay_s: float = 0.0) -> None:
        """A producer's message put as text, without base64 (raw JSON, or anything else)."""
        self.jobs.put(text, delay_s)

    # -- the host ----------------------------------------------------------------------------

    def step(self) -> bool:
        """Deliver the next visible message (jobs first, then poison), or run the sweeper, or
        advance time to the next event. False when nothing is left to happen."""
        for queue, function in ((self.jobs, process_message), (self.poison, handle_poison_message)):
            visible = queue.visible()
            if visible:
                self.deliver(queue, queue.take(visible[0], self.rules.lease_s), function)
                return True
        if self.poison.messages and self.clock() >= self._next_sweep:
            self._next_sweep = self.clock() + timedelta(seconds=SWEEP_EVERY_S)
            self.guarded(lambda: sweep(self.rt))
            return True
        if self.claims_open() and self.clock() >= self._next_recovery:
            self._next_recovery = self.clock() + timedelta(seconds=self.settings.recovery_interval_s)
            self.guarded(self.recover)
            return True
        moments = [
            m
            for m in (self.jobs.next_visible_at(), self.poison.next_visible_at(), self.clock.next_due())
            if m
        ]
        if self.poison.messages:
            moments.append(self._next_sweep)
        if self.claims_open():
            moments.append(self._next_recovery)
        if not moments:
            return False
        try:
            self.clock.advance_to(max(min(moments), self.clock()))
        except SimCrash:
            self.crash(None)
        return True

    def claims_open(self) -> dict[str, datetime]:
        """In-progress records and their claims' ends (read directly: not a storage call). The
        recovery watch runs (on a live or restarted worker, every RECOVERY_INTERVAL_SECONDS)
        only while one exists: with none it would find nothing, and the world could not settle."""
        found = {}
        for name, (data, _, _) in self.ledger_docs.docs.items():
            end = lease_end(data)
            if end is not None:
                found[name.removesuffix(".json")] = end
        return found

    def recover(self) -> None:
        self.recoveries += len(recover_claims(self.rt).resent)

    def deliver(self, queue: SimQueue, msg: SimMessage, function: Callable[..., None]) -> None:
        is_poison_queue = queue is self.poison
        if msg.dequeue_count > self.rules.max_dequeue_count:
            if not is_poison_queue:
                self.move_to_poison(queue, msg)
            return  # a -poison queue has no poison queue: left leased, never called
        body = self.received_body(msg)
        if body is None:
            if not is_poison_queue:
                self.move_to_poison(queue, msg)
            return  # a -poison queue has no poison queue: left leased, never called
        try:
            function(Delivered(msg.id, msg.dequeue_count, body, msg.inserted_on), self.rt)
        except SimCrash:
            self.crash(msg)
            return
        except (Exception, SimWorkerDied) as exc:
            if isinstance(exc, SimWorkerDied):  # every heartbeat of that worker stops with it
                self.crashes += 1
                self.clock.cancel_all()
            if msg.dequeue_count >= self.rules.max_dequeue_count:
                if not is_poison_queue:
                    self.move_to_poison(queue, msg)
                return
            msg.visible_at = self.clock() + timedelta(seconds=self.rules.visibility_timeout_s)
            return
        self.host_delete(queue, msg)

    def received_body(self, msg: SimMessage) -> bytes | None:
        """The body the host hands the function under host.json's messageEncoding (None: the
        host cannot decode it, so it calls nothing)."""
        if self.rules.message_encoding == "none":
            return msg.content.encode("utf-8")
        try:
            return base64.b64decode(msg.content.encode("ascii"), validate=True)
        except ValueError:
            return None

    def host_delete(self, queue: SimQueue, msg: SimMessage) -> None:
        try:
            queue.delete_message(msg)
        except SimCrash:
            self.crash(msg)
        except StorageBusy:  # the host would stop; its lease runs out and the message is back
            pass

    def move_to_poison(self, queue: SimQueue, msg: SimMessage) -> None:
        self.poison.put(msg.content)
        queue.messages.pop(msg.id, None)

    def crash(self, msg: SimMessage | None) -> None:
        """The worker dies: heartbeats stop; the message comes back when its lease ends."""
        self.crashes += 1
        if self.crashes == 1:
            self.claims_at_crash = self.claims_open()
        self.claim_ends.extend(self.claims_open().values())
        self.clock.cancel_all()
        if msg is not None:
            msg.visible_at = self.clock() + timedelta(seconds=self.rules.lease_s)

    def guarded(self, action: Callable[[], object]) -> None:
        """An operator or timer action: a crash or storage error just ends it."""
        try:
            action()
        except SimCrash:
            self.crash(None)
        except Exception:
            pass

    def run(self, max_steps: int = 5_000) -> int:
        for steps in range(max_steps):
            if not self.step():
                return steps
        raise AssertionError(f"no quiescence after {max_steps} steps")


# -- interleavings ----------------------------------------------------------------------------


class Interleaver:
    """Runs deliveries on threads, one at a time. Each storage call is a point where the
    schedule chooses which delivery goes on: `prefix` gives the first choices, after which the
    running delivery keeps going while it can. `trace` records (runnable, chosen) per point."""

    def __init__(self, prefix: list[int]) -> None:
        self.prefix = prefix
        self.trace: list[tuple[tuple[int, ...], int]] = []
        self._cond = threading.Condition()
        self._turn: int | None = None
        self._parked: set[int] = set()
        self._done: set[int] = set()
        self._index: dict[int, int] = {}

    def gate(self) -> None:
        me = self._index.get(threading.get_ident())
        if me is None:
            return  # the main thread (sequential phase) never waits
        with self._cond:
            self._parked.add(me)
            self._turn = None
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._turn == me)
            self._parked.discard(me)

    def run(self, deliveries: list[Callable[[], None]]) -> None:
        threads = []
        for i, delivery in enumerate(deliveries):
            thread = threading.Thread(target=self._body, args=(i, delivery), daemon=True)
            threads.append(thread)
            thread.start()
        with self._cond:
            self._cond.wait_for(lambda: len(self._parked) == len(deliveries))
        last: int | None = None
        while True:
            with self._cond:
                runnable = tuple(sorted(self._parked))
                if not runnable:
                    break
                step = len(self.trace)
                if step < len(self.prefix) and self.prefix[step] in runnable:
                    chosen = self.prefix[step]
                else:
                    chosen = last if last in runnable else runnable[0]
                self.trace.append((runnable, chosen))
                last = chosen
                self._turn = chosen
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._turn is None)
        for thread in threads:
            thread.join(10)

    def _body(self, i: int, delivery: Callable[[], None]) -> None:
        self._index[threading.get_ident()] = i
        self.gate()  # wait for the first turn
        try:
            delivery()
        finally:
            with self._cond:
                self._done.add(i)
                self._turn = None
                self._cond.notify_all()


def preemptions(trace: list[tuple[tuple[int, ...], int]]) -> int:
    """Switches away from a delivery that could have gone on."""
    count, last = 0, None
    for runnable, chosen in trace:
        if last is not None and last in runnable and chosen != last:
            count += 1
        last = chosen
    return count


def schedules(
    run: Callable[[list[int]], list[tuple[tuple[int, ...], int]]], bound: int = 2
) -> Iterator[list[int]]:
    """Every choice sequence with at most `bound` preemptions (depth-first); `run(prefix)` runs
    one schedule and returns its trace. Yields each prefix explored."""
    stack: list[list[int]] = [[]]
    seen: set[tuple[int, ...]] = set()
    while stack:
        prefix = stack.pop()
        trace = run(prefix)
        yield prefix
        choices = [chosen for _, chosen in trace]
        for p in range(len(prefix), len(trace)):
            for alternative in trace[p][0]:
                if alternative == choices[p]:
                    continue
                candidate = [*choices[:p], alternative]
                key = tuple(candidate)
                if key in seen or preemptions([*trace[:p], (trace[p][0], alternative)]) > bound:
                    continue
                seen.add(key)
                stack.append(candidate)
