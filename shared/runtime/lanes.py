"""Each declared queue's view of the runtime (its lane): what one queue's jobs see.

A lane is the runtime with the queue's settings (`Settings.for_queue`: its expiry, retry policy,
`HTTP_*` overrides), its kinds configured with them, its sends (`<name>` and `<name>-poison`, in
the queue's own storage account when `QUEUE_<NAME>_CONNECTION` names one) and its ledger keys:
the default queue's records are `<id>.json` as with one queue; another queue's are
`<name>/<id>.json` and say `queue`, so two queues may use the same job id. Handlers see the job
as `<name>/<id>` too (`job_key`): their results and idempotency keys are the queue's own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol, TypeVar

from shared.config.settings import Settings, storage_connection
from shared.core.backoff import RetryPolicy
from shared.core.documents import Document, DocumentStore, TagQuery
from shared.core.errors import SettingsError
from shared.jobs.base import Handler
from shared.jobs.kinds import configure_kinds
from shared.ledger import Ledger
from shared.permits.parked_messages import QueueParking
from shared.queues import QueueSettings, setting_name
from shared.storage.accounts import account_for
from shared.storage.ports import Account


class LaneHost(Protocol):
    """What a lane is made from (the runtime, shared/runtime/wiring.py)."""

    settings: Settings
    account: Account
    ledger: Ledger
    ledger_docs: DocumentStore
    parking: Any
    lanes: Any
    queue_account: Any


R = TypeVar("R", bound=LaneHost)


class QueueKeyed:
    """A ledger store seen by one queue: names under `<queue>/`, every write saying `queue`."""

    def __init__(self, inner: DocumentStore, queue: str) -> None:
        self.inner = inner
        self.queue = queue
        self.prefix = f"{queue}/"

    def _stamped(self, data: dict[str, Any]) -> dict[str, Any]:
        data["queue"] = self.queue
        return data

    def read(self, name: str) -> Document | None:
        return self.inner.read(self.prefix + name)

    def create(self, name: str, data: dict[str, Any]) -> Document:
        return self.inner.create(self.prefix + name, self._stamped(data))

    def replace(self, name: str, current: Document, data: dict[str, Any]) -> Document:
        return self.inner.replace(self.prefix + name, current, self._stamped(data))

    def upsert(self, name: str, data: dict[str, Any]) -> Document:
        return self.inner.upsert(self.prefix + name, self._stamped(data))

    def delete(self, name: str) -> None:
        self.inner.delete(self.prefix + name)

    def names(self, prefix: str) -> Iterator[tuple[str, datetime | None]]:
        for name, modified in self.inner.names(self.prefix + prefix):
            yield name.removeprefix(self.prefix), modified

    def find(self, query: TagQuery) -> Iterator[str]:
        for name in self.inner.find(query):
            if name.startswith(self.prefix):
                yield name.removeprefix(self.prefix)


def queue_policy(policy: RetryPolicy, queue: QueueSettings) -> RetryPolicy:
    """A kind's retry policy on `queue`: the queue's own values where it sets them (pure)."""
    return RetryPolicy(
        attempts=queue.max_attempts if queue.max_attempts is not None else policy.attempts,
        base_s=queue.retry_base_s if queue.retry_base_s is not None else policy.base_s,
        cap_s=queue.retry_max_s if queue.retry_max_s is not None else policy.cap_s,
        jitter=policy.jitter,
    )


def lane(rt: R, app: Settings, queue: QueueSettings, handlers: Mapping[str, Handler]) -> R:
    """`rt` as `queue`'s jobs see it, from the app's settings `app` (start-up: SettingsError
    names a bad setting)."""
    settings = app.for_queue(queue)
    kinds = configure_kinds(settings, handlers)
    sends = rt.account
    if queue.connection is not None:
        try:
            sends = account_for(storage_connection(settings.source, queue.connection))
        except SettingsError as exc:
            raise SettingsError(
                f"{setting_name(queue.name, 'CONNECTION')}={queue.connection}: {exc}"
            ) from None
    jobs_queue = sends.queue(queue.name)
    return replace(  # type: ignore[type-var]  # a dataclass (the runtime)
        rt,
        settings=settings,
        handlers=kinds.handlers,
        retry_policies={kind: queue_policy(policy, queue) for kind, policy in kinds.retry.items()},
        jobs_queue=jobs_queue,
        poison_queue=sends.raw_queue(queue.poison),
        queue_account=sends if queue.connection is not None else None,
        ledger=rt.ledger if queue.default else Ledger(QueueKeyed(rt.ledger.store, queue.name)),
        ledger_docs=rt.ledger_docs if queue.default else QueueKeyed(rt.ledger_docs, queue.name),
        parking=rt.parking if queue.default else QueueParking(jobs_queue),  # on the lane's own queue
        lane=queue,
        lanes={},
    )


def build_lanes(template: R, handlers: Mapping[str, Handler]) -> R:
    """Every declared queue's lane, each able to find the others (`Runtime.for_queue`), made
    from `template` (the runtime on the app's settings); returns the default queue's, which is
    the process's runtime."""
    app = template.settings
    lanes = {queue.name: lane(template, app, queue, handlers) for queue in app.queue_set}
    for each in lanes.values():
        each.lanes = lanes
    return lanes[app.queue_set.default.name]
