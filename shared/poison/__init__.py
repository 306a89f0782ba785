"""Poison, in one home: the handler and sweeper, the archive layout, and the operator tools."""

from shared.poison.archive import entry_name
from shared.poison.bulk_step import handle_op_message
from shared.poison.handler import archive_message, handle_poison_message, judge, sweep
from shared.poison.operations import (
    PoisonEntry,
    ReplayReport,
    list_poisoned,
    peek_poison_queue,
    purge,
    replay,
    replay_one,
)

__all__ = [
    "PoisonEntry",
    "ReplayReport",
    "archive_message",
    "entry_name",
    "handle_op_message",
    "handle_poison_message",
    "judge",
    "list_poisoned",
    "peek_poison_queue",
    "purge",
    "replay",
    "replay_one",
    "sweep",
]
