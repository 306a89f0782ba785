"""JSON from outside the app (message bodies, request bodies, blobs): every failure is a JSONDecodeError."""

from __future__ import annotations

import json
from typing import Any

TOO_DEEP = "nested too deeply (arrays or objects inside each other beyond what the parser allows)"


def loads(data: str | bytes | bytearray) -> Any:
    """`json.loads`; nesting beyond the parser's recursion limit is a JSONDecodeError naming it,
    never a RecursionError, so every caller's bad-input path handles it."""
    try:
        return json.loads(data)
    except RecursionError:
        raise json.JSONDecodeError(TOO_DEEP, "", 0) from None
