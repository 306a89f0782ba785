"""Masking a secret in the encodings a downstream echoes it in, and the destinations' parsing (pure)."""

from __future__ import annotations

import base64
import json
import re
import urllib.parse

import pytest

from shared.net.destinations import AllowList, BadUrl, destination
from shared.net.masking import Masker

SECRET = "s3cr/et+Valué x"


def forms() -> list[str]:
    raw = SECRET.encode()
    out = [
        SECRET,
        json.dumps(SECRET),
        json.dumps(SECRET).replace("/", "\\/"),
        "".join(f"\\u{ord(c):04X}" for c in SECRET),
        urllib.parse.quote(SECRET),
        re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), urllib.parse.quote_plus(SECRET)),
        raw.hex(),
        raw.hex().upper(),
    ]
    for pad in range(3):
        out.append(base64.b64encode(b"p" * pad + raw + b"q").decode())
        out.append(base64.urlsafe_b64encode(b"p" * pad + raw).decode().rstrip("="))
    return out


@pytest.mark.parametrize("form", forms())
def test_every_usual_encoding_is_masked_in_text_and_bytes(form: str) -> None:
    masker = Masker([SECRET])
    text = f"before {form} after"
    assert masker.text(text) != text and "***" in masker.text(text)
    assert b"***" in masker.bytes(text.encode())


def test_utf16_is_masked_in_its_own_encoding() -> None:
    for codec in ("utf-16-le", "utf-16-be"):
        body = json.dumps({"echo": SECRET}, ensure_ascii=False).encode(codec)
        assert json.loads(Masker([SECRET]).bytes(body).decode(codec)) == {"echo": "***"}


def test_decoded_json_is_masked_again() -> None:
    assert Masker([SECRET]).value({"a": [SECRET, {SECRET: 1}]}) == {"a": ["***", {"***": 1}]}


def test_the_window_covers_the_longest_form() -> None:
    masker = Masker([SECRET])
    longest = max(len(f) for f in forms())
    assert masker.window >= longest


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("https://2130706433/", "127.0.0.1", 443),
        ("https://0x7f000001/", "127.0.0.1", 443),
        ("https://127.1/", "127.0.0.1", 443),
        ("https://0/", "0.0.0.0", 443),
        ("https://0177.0.0.1:8443/", "127.0.0.1", 8443),
        ("http://[0:0:0:0:0:0:0:1]/", "::1", 80),
        ("https://BÜCHER.test./", "xn--bcher-kva.test", 443),
        ("https://Example.COM.:8443/", "example.com", 8443),
    ],
)
def test_destinations_are_canonical(url: str, host: str, port: int) -> None:
    dest = destination(url)
    assert (dest.host, dest.port) == (host, port)


@pytest.mark.parametrize(
    "url",
    [
        "https://[::1/",
        "https://h:99999/",
        "https://h:abc/",
        "https://h:0/",
        "https://h:+80/",
        "https://u:p@h/",
        "ftp://h/",
        "https:///x",
        "https://a b/",
        "https://256.1.1.1.1/",
        "https://4294967296/",
    ],
)
def test_bad_urls_say_why(url: str) -> None:
    with pytest.raises(BadUrl):
        destination(url)


def test_allow_list_entries_carry_ports() -> None:
    allowed = AllowList.parse("partner.example:8443, [::1]:9000, plain.example")
    assert allowed.allows(destination("https://partner.example:8443/"))
    assert not allowed.allows(destination("https://partner.example/"))
    assert allowed.allows(destination("http://[0::1]:9000/"))
    assert allowed.allows(destination("https://plain.example/")) and allowed.allows(
        destination("http://plain.example/")
    )
    assert not allowed.allows(destination("https://plain.example:444/"))
    with pytest.raises(BadUrl):
        AllowList.parse("host:99999")
