"""A job's payload as its handler gets it: inline, or read back from its claim check."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shared.core import jsontext
from shared.core.envelope import Envelope
from shared.core.errors import EnvelopeError, InputMissing, LimitExceeded
from shared.runtime.wiring import Runtime
from shared.storage.failures import NotFound
from shared.storage.limits import BlobTooLarge


def load_payload(rt: Runtime, env: Envelope) -> Mapping[str, Any]:
    """The inline payload, or the claim-checked one from the payloads container.

    A claim-checked payload is read only up to MAX_PAYLOAD_BYTES (a larger blob is refused from
    its size, never read whole): the limit the API applies when it writes one.
    """
    if env.payload_ref is None:
        return env.payload or {}
    limit = rt.settings.max_payload_bytes
    try:
        raw = rt.account.blobs(rt.settings.payloads_container).read_capped(env.payload_ref, limit)
    except NotFound:
        raise InputMissing(
            f"payload_ref: blob {rt.settings.payloads_container}/{env.payload_ref} does not exist (dangling claim check)"
        ) from None
    except BlobTooLarge as big:
        raise LimitExceeded(
            f"payload_ref: blob {rt.settings.payloads_container}/{env.payload_ref} is {big.size} bytes, "
            f"over MAX_PAYLOAD_BYTES={limit}: not read"
        ) from None
    try:
        payload = jsontext.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise EnvelopeError([f"payload_ref: blob {env.payload_ref} is not JSON"], job_id=env.id) from None
    if not isinstance(payload, dict):
        raise EnvelopeError([f"payload_ref: blob {env.payload_ref} must hold a JSON object"], job_id=env.id)
    return payload
