"""Property-based fuzzing: no input crashes the parsers; every rejection has a readable reason."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.aggregation import parse_aggregate_payload
from shared.core.envelope import ID_RE, best_effort_id, encode_text, parse_body, parse_dict
from shared.core.errors import EnvelopeError, PayloadError

KINDS = {"aggregate", "noop"}
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
near_envelopes = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.from_regex(ID_RE, fullmatch=True), json_values),
        "kind": st.sampled_from(["aggregate", "noop", "Nope", ""]) | json_values,
        "payload": st.dictionaries(st.text(max_size=8), json_values, max_size=3) | json_values,
        "payload_ref": st.text(max_size=30) | json_values,
        "attempt": st.integers(-5, 2000) | json_values,
        "created_at": st.datetimes().map(lambda d: d.isoformat()) | json_values,
        "expires_at": st.text(max_size=30),
        "continuation_seq": st.integers(-3, 5) | json_values,
        "x": json_values,
    },
)
FUZZ = settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


def readable(problems: list[str]) -> bool:
    """Each problem names a field, then says what is wrong, in printable text."""
    return bool(problems) and all(":" in p and p.isprintable() and len(p) < 400 for p in problems)


@FUZZ
@given(st.binary(max_size=2000))
def test_any_bytes_either_parse_or_give_a_readable_error(body: bytes) -> None:
    try:
        parse_body(body, KINDS)
    except EnvelopeError as exc:
        assert readable(exc.problems), exc.problems
    best_effort_id(body)  # never raises


@FUZZ
@given(near_envelopes)
def test_near_envelopes_round_trip_or_name_each_problem(data: dict[str, Any]) -> None:
    raw = json.dumps(data).encode()
    try:
        env = parse_body(raw, KINDS)
    except EnvelopeError as exc:
        assert readable(exc.problems), exc.problems
        return
    import base64

    assert parse_body(base64.b64decode(encode_text(env)), KINDS) == env  # nothing lost on the way back


@FUZZ
@given(json_values)
def test_any_json_value_as_envelope(value: Any) -> None:
    try:
        parse_dict(value, KINDS)
    except EnvelopeError as exc:
        assert readable(exc.problems), exc.problems


metric = st.fixed_dictionaries(
    {"op": st.sampled_from(["count", "sum", "mean", "min", "max", "median"]) | json_values},
    optional={"column": st.text(max_size=6) | json_values, "as": st.text(max_size=6) | json_values},
)
payloads = st.fixed_dictionaries(
    {},
    optional={
        "input": st.sampled_from(["data/a.csv", "data/../x", "/abs", "c/", "Bad_Container/x", "d/a\\b"])
        | st.text(max_size=30)
        | json_values,
        "format": st.sampled_from(["csv", "jsonl", "xml"]) | json_values,
        "group_by": st.lists(st.text(max_size=6), max_size=3) | json_values,
        "metrics": st.lists(metric, max_size=4) | json_values,
        "engine": st.sampled_from(["auto", "inline", "spark", "gpu"]) | json_values,
        "null_values": st.lists(st.text(max_size=3), max_size=3) | json_values,
        "zzz": json_values,
    },
)


@FUZZ
@given(payloads | json_values)
def test_aggregate_payload_validation_never_crashes(payload: Any) -> None:
    try:
        parse_aggregate_payload(payload)
    except PayloadError as exc:
        assert readable(exc.problems), exc.problems
