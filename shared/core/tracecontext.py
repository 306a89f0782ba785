"""W3C trace context values (pure): what a `traceparent` / `tracestate` may be.

https://www.w3.org/TR/trace-context/: `traceparent` is `version-traceid-parentid-flags` in lower-case
hex; version `ff` and all-zero ids are invalid; a future version may append fields after a `-`.
`tracestate` is opaque here: printable ASCII, at most 512 characters (32 list members)."""

from __future__ import annotations

import re

TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[ -~]*)?$")
TRACESTATE_MAX = 512
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


def traceparent_problem(value: object) -> str | None:
    """Why `value` is not a usable `traceparent` (None: it is)."""
    if not isinstance(value, str):
        return "must be a string like 00-<32 hex>-<16 hex>-<2 hex>"
    match = TRACEPARENT_RE.match(value)
    if match is None or len(value) > 256:
        return "must be a W3C traceparent: 00-<32 lower-case hex>-<16 lower-case hex>-<2 hex>"
    version, trace_id, span_id, _flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return "version ff is invalid, and version 00 has exactly four fields"
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return "the trace id and the parent id must not be all zeros"
    return None


def tracestate_problem(value: object) -> str | None:
    """Why `value` is not a usable `tracestate` (None: it is)."""
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > TRACESTATE_MAX or any(not " " <= ch <= "~" for ch in value):
        return f"must be at most {TRACESTATE_MAX} printable ASCII characters"
    return None


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a valid `traceparent`, else None."""
    if traceparent is None or traceparent_problem(traceparent) is not None:
        return None
    return traceparent.split("-", 2)[1]
