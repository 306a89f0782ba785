"""Envelope parsing: strict, every problem named by its field."""

from __future__ import annotations

import base64
import json

import pytest

from shared.core.envelope import (
    QUEUE_MESSAGE_LIMIT,
    Envelope,
    best_effort_id,
    check_payload_ref,
    decode_message,
    encode_text,
    fits_queue,
    parse_body,
    parse_dict,
    utcnow,
)
from shared.core.errors import EnvelopeError

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
        (b"\xff\xfe not utf8", "message: body (raw, or base64-decoded) is not UTF-8 text (byte 0 of 11)"),
        (b"{not json", "message: body (raw, or base64-decoded) is not JSON"),
        (b"[1, 2]", "message: expected a JSON object, got array"),
        (b'"text"', "message: expected a JSON object, got string"),
        (body({"kind": "noop", "payload": {}}), "id: required"),
        (body({"id": 7, "kind": "noop", "payload": {}}), "id: must be a string, got integer"),
        (body({"id": "a/b", "kind": "noop", "payload": {}}), 'id: "a/b" must be 1 to 128 characters'),
        (body({"id": "x" * 129, "kind": "noop", "payload": {}}), "must be 1 to 128 characters"),
        (body({"id": "", "kind": "noop", "payload": {}}), "must be 1 to 128 characters"),
        (body({"id": ".", "kind": "noop", "payload": {}}), 'id: "." must be 1 to 128'),
        (body({"id": "..", "kind": "noop", "payload": {}}), "and not only dots"),
        (body({"id": "....", "kind": "noop", "payload": {}}), "and not only dots"),
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


def test_base64_and_raw_bodies_decode_to_the_same_envelope() -> None:
    raw = body({"id": "j1", "kind": "noop", "payload": {"a": 1}})
    for received in (raw, base64.b64encode(raw), base64.encodebytes(raw), b" " + raw + b"\n"):
        assert parse_body(decode_message(received), KINDS).id == "j1"


@pytest.mark.parametrize(
    "received",
    [
        b"not base64 !!!",
        b"",
        b"  ",
        b"QR==",
        b"\xff\xfe",
        b"{truncated",
        b'"quoted"',
        b"1234x",
        b"null",
        b"1234",
    ],
)
def test_what_is_not_canonical_base64_is_kept_as_received(received: bytes) -> None:
    assert decode_message(received) == received


def test_canonical_base64_is_decoded_byte_for_byte() -> None:
    for raw in (b"\xff\xfe\x00 binary", b"{truncated", b"hi"):
        assert decode_message(base64.b64encode(raw)) == raw


def test_ids_a_blob_name_would_normalise_are_refused_everywhere() -> None:
    for job_id in (".", "..", "..."):
        assert best_effort_id(body({"id": job_id})) is None
        with pytest.raises(EnvelopeError, match="not only dots"):
            parse_dict({"id": job_id, "kind": "noop", "payload": {}}, KINDS)
    assert parse_dict({"id": "a..b.", "kind": "noop", "payload": {}}, KINDS).id == "a..b."


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


@pytest.mark.parametrize("depth", [2_000, 32_000])
def test_a_body_nested_too_deeply_is_a_bad_envelope_not_a_crash(depth: int) -> None:
    body = b"[" * depth + b"]" * depth
    for received in (body, base64.b64encode(body)):
        with pytest.raises(EnvelopeError, match="nested too deeply"):
            parse_body(decode_message(received))
    assert best_effort_id(body) is None
