"""Putting a job message on the jobs queue: the one send every producer, retry and replay uses."""

from __future__ import annotations

from shared.core.envelope import Envelope, encode_json
from shared.core.messages import NEVER_EXPIRE
from shared.runtime.wiring import Runtime


def send_job(rt: Runtime, env: Envelope, delay_s: int = 0) -> None:
    """Put a job message on the jobs queue (never expiring), visible after `delay_s`."""
    rt.jobs_queue.send_message(
        encode_json(env), visibility_timeout=delay_s or None, time_to_live=NEVER_EXPIRE
    )
