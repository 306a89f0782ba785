"""Keys shared by the Table indexes: newest first, safe in PartitionKey/RowKey, escaped in filters."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

MAX_MS = 10**13 - 1
_FORBIDDEN = str.maketrans({"/": "|", "\\": "|", "#": "~", "?": "~"})


def stamp_ms(iso: str | None) -> int:
    """Milliseconds since the epoch of an ISO stamp (0 when missing or unreadable)."""
    if not iso:
        return 0
    try:
        moment = datetime.fromisoformat(str(iso).replace("Z", "+00:00"))
    except ValueError:
        return 0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def newest_first(iso: str | None, name: str) -> str:
    """A RowKey that sorts newer stamps first, then by name (which keeps it unique)."""
    return f"{MAX_MS - stamp_ms(iso):013d}_{name.translate(_FORBIDDEN)}"


def day_of(iso: str | None) -> str:
    """YYYYMMDD (UTC) of a stamp; 19700101 when it has none."""
    return datetime.fromtimestamp(stamp_ms(iso) / 1000, UTC).strftime("%Y%m%d")


def table_prefix(container: str, size: int = 40) -> str:
    """A Table name prefix from a container name (letters and digits, starting with a letter), so
    that apps sharing an account (and tests) keep apart indexes."""
    kept = "".join(c for c in container.lower() if c.isalnum())[:size]
    return kept if kept[:1].isalpha() else f"t{kept}"[:size]


def quoted(value: str) -> str:
    """An OData string literal."""
    return "'" + value.replace("'", "''") + "'"


def clip(value: Any, size: int = 256) -> str:
    return "" if value is None else str(value)[:size]


def encode_token(data: dict[str, Any] | None) -> str | None:
    if data is None:
        return None
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode()


def decode_token(token: str | None) -> dict[str, Any] | None:
    """A page token back; None when absent or not one of ours (the first page then)."""
    if not token:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None
