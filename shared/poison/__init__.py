"""Poison, in one home: the handler and sweeper, the archive layout, and the operator tools."""

from shared.poison.bulk_step import handle_op_message
from shared.poison.handler import archive_message, handle_poison_message, judge, sweep
from shared.poison.operations import list_poisoned, peek_poison_queue
from shared.poison.purge import start_purge
from shared.poison.replay import ReplayReport, replay_jobs

__all__ = [
    "ReplayReport",
    "archive_message",
    "handle_op_message",
    "handle_poison_message",
    "judge",
    "list_poisoned",
    "peek_poison_queue",
    "replay_jobs",
    "start_purge",
    "sweep",
]
