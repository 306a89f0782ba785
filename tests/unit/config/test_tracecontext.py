"""Issue 36: the envelope's optional, validated trace context, and the pure rules around it."""

from __future__ import annotations

import json

import pytest

from shared.core.envelope import encode_json, parse_dict
from shared.core.errors import EnvelopeError
from shared.core.tracecontext import trace_id_of, traceparent_problem, tracestate_problem
from shared.observability import tracing

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "value",
    [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # three fields
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent id
        f"{VALID}-extra",  # version 00 has four fields
        "",
        17,
    ],
)
def test_invalid_traceparents_are_named(value: object) -> None:
    assert traceparent_problem(value) is not None
    assert trace_id_of(value if isinstance(value, str) else None) is None


def test_valid_traceparents_and_tracestates() -> None:
    assert traceparent_problem(VALID) is None
    assert traceparent_problem("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future") is None
    assert trace_id_of(VALID) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert tracestate_problem("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7") is None
    assert tracestate_problem("x" * 513) is not None and tracestate_problem("a=\n") is not None


def test_the_envelope_carries_a_producers_traceparent_through_retries() -> None:
    env = parse_dict(
        {"kind": "noop", "payload": {}, "traceparent": VALID, "tracestate": "a=1"},
        producer=True,
        require_id=False,
    )
    retry = env.with_attempt(2, 3)
    assert (retry.traceparent, retry.tracestate) == (VALID, "a=1")
    assert json.loads(encode_json(retry))["traceparent"] == VALID
    assert parse_dict(retry.to_dict()) == retry
    assert "traceparent" not in parse_dict({"id": "a", "kind": "noop", "payload": {}}).to_dict()


def test_an_invalid_trace_context_in_the_envelope_is_refused() -> None:
    with pytest.raises(EnvelopeError) as caught:
        parse_dict({"id": "a", "kind": "noop", "payload": {}, "traceparent": "00-nope", "tracestate": 3})
    assert [p.split(":")[0] for p in caught.value.problems] == ["traceparent", "tracestate"]
    with pytest.raises(EnvelopeError, match="tracestate: only with a traceparent"):
        parse_dict({"id": "a", "kind": "noop", "payload": {}, "tracestate": "a=1"})


def test_request_carrier_prefers_a_valid_header_and_ignores_an_invalid_one() -> None:
    env = parse_dict({"id": "a", "kind": "noop", "payload": {}, "traceparent": VALID})
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    assert tracing.request_carrier({"TraceParent": other, "tracestate": "b=2"}, env) == {
        "traceparent": other,
        "tracestate": "b=2",
    }
    assert tracing.request_carrier({"traceparent": "garbage"}, env) == {"traceparent": VALID}
    assert tracing.request_carrier({}, parse_dict({"id": "a", "kind": "noop", "payload": {}})) == {}


def test_took_over_reads_the_last_history_entry() -> None:
    assert tracing.took_over({"history": [{"event": "claimed", "takeover_of": "host/1"}]})
    assert not tracing.took_over(
        {"history": [{"event": "claimed", "takeover_of": "host/1"}, {"event": "completed"}]}
    )
    assert not tracing.took_over({"history": [{"event": "claimed"}]}) and not tracing.took_over({})
