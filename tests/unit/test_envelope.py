"""Envelope parsing: strict, every problem named by its field."""

from __future__ import annotations

import base64
import json

import pytest

from shared.envelope import (
    QUEUE_MESSAGE_LIMIT,
    Envelope,
    best_effort_id,
    check_payload_ref,
    decode_base64_text,
    encode_text,
    fits_queue,
    parse_body,
    parse_dict,
    utcnow,
)
from shared.errors import EnvelopeError

KINDS = {"aggregate", "noop"}


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


def problems(raw: bytes) -> list[str]:
    with pytest.raises(EnvelopeError) as info:
        parse_body(raw, KINDS)
    return info.value.problems


def test_valid_envelope_round_trips() -> None:
    env = parse_body(
        body(
            {
                "id": "job-1",
                "kind": "noop",
                "payload": {"a": 1},
                "attempt": 2,
                "created_at": "2026-01-02T03:04:05Z",
            }
        ),
        KINDS,
    )
    assert (env.id, env.kind, env.payload, env.attempt) == ("job-1", "noop", {"a": 1}, 2)
    assert env.created_at.year == 2026 and env.created_at.tzinfo is not None
    again = parse_body(base64.b64decode(encode_text(env)), KINDS)
    assert again == env


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"\xff\xfe not utf8", "message: body is not UTF-8"),
        (b"{not json", "message: body is not JSON"),
        (b"[1, 2]", "message: expected a JSON object, got array"),
        (b'"text"', "message: expected a JSON object, got string"),
        (body({"kind": "noop", "payload": {}}), "id: required"),
        (body({"id": 7, "kind": "noop", "payload": {}}), "id: must be a string, got integer"),
        (body({"id": "a/b", "kind": "noop", "payload": {}}), 'id: "a/b" must be 1 to 128 characters'),
        (body({"id": "x" * 129, "kind": "noop", "payload": {}}), "must be 1 to 128 characters"),
        (body({"id": "", "kind": "noop", "payload": {}}), "must be 1 to 128 characters"),
        (body({"id": "j", "payload": {}}), "kind: required"),
        (body({"id": "j", "kind": "median", "payload": {}}), "kind: unknown kind 'median'"),
        (body({"id": "j", "kind": 3, "payload": {}}), "kind: must be a lower-case name"),
        (body({"id": "j", "kind": "noop"}), "payload: required"),
        (body({"id": "j", "kind": "noop", "payload": [1]}), "payload: must be an object, got array"),
        (body({"id": "j", "kind": "noop", "payload": {}, "payload_ref": "x"}), "give one, not both"),
        (body({"id": "j", "kind": "noop", "payload_ref": "../etc/passwd"}), "must not contain '.' or '..'"),
        (body({"id": "j", "kind": "noop", "payload_ref": "/abs"}), "must be a relative blob name"),
        (body({"id": "j", "kind": "noop", "payload": {}, "attempt": "1"}), "attempt: must be an integer"),
        (body({"id": "j", "kind": "noop", "payload": {}, "attempt": True}), "attempt: must be an integer"),
        (body({"id": "j", "kind": "noop", "payload": {}, "attempt": -1}), "attempt: must be an integer"),
        (
            body({"id": "j", "kind": "noop", "payload": {}, "created_at": "yesterday"}),
            'created_at: "yesterday"',
        ),
        (
            body({"id": "j", "kind": "noop", "payload": {}, "expires_at": 5}),
            "expires_at: must be an ISO-8601",
        ),
        (body({"id": "j", "kind": "noop", "payload": {}, "extra": 1}), "extra: unknown field"),
    ],
)
def test_each_bad_envelope_names_its_problem(raw: bytes, expected: str) -> None:
    found = problems(raw)
    assert any(expected in p for p in found), found


def test_all_problems_are_listed_at_once() -> None:
    found = problems(body({"id": 5, "kind": "zzz", "payload": 3, "attempt": "x"}))
    assert len(found) == 4, found


def test_job_id_is_kept_on_error_when_readable() -> None:
    with pytest.raises(EnvelopeError) as info:
        parse_body(body({"id": "job-9", "kind": "zzz", "payload": {}}), KINDS)
    assert info.value.job_id == "job-9"
    assert best_effort_id(body({"id": "job-9"})) == "job-9"
    assert best_effort_id(b"\x00garbage") is None
    assert best_effort_id(body({"id": "../x"})) is None


def test_missing_id_gets_a_uuid_when_allowed() -> None:
    env = parse_dict({"kind": "noop", "payload": {}}, KINDS, require_id=False)
    assert len(env.id) == 36


def test_bad_base64_is_an_envelope_error() -> None:
    with pytest.raises(EnvelopeError, match="not valid base64"):
        decode_base64_text("not base64 !!!")
    assert decode_base64_text(base64.b64encode(b"hi").decode()) == b"hi"


def test_queue_limit_is_measured_on_the_encoded_text() -> None:
    small = Envelope(id="j", kind="noop", created_at=utcnow(), payload={"x": "a" * 100})
    big = Envelope(id="j", kind="noop", created_at=utcnow(), payload={"x": "a" * 49_152})
    assert fits_queue(small)
    assert not fits_queue(big)
    assert len(encode_text(big)) > QUEUE_MESSAGE_LIMIT


@pytest.mark.parametrize("ref", ["a/../b", "..", "a\\b", "a//b", "/a", "a\x01b", ""])
def test_payload_ref_path_tricks(ref: str) -> None:
    assert check_payload_ref(ref)


def test_payload_ref_plain_name_is_fine() -> None:
    assert check_payload_ref("job-1/abc.json") == []
