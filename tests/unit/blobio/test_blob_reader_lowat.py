"""The reader's low-water mark (SO_RCVLOWAT) on real loopback sockets, over HTTP and HTTPS.

A body that arrives in small pieces, pauses included, must be read whole, and a kept-alive
connection must read its next answer: a mark left too high waits for bytes never sent, which
here would end in the socket's timeout (named in the error) instead of the data.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import shared.blobio.reader as blob_reader
from shared.blobio.reader import LOWAT_BYTES, LOWAT_SLACK, Bearer, BlobReader
from shared.core.errors import StorageThrottled

BIG = bytes(range(251)) * 12_000  # 3,012,000 bytes: three 1 MiB ranges, then a short one
PIECE = 1_500


class TrickleHandler(BaseHTTPRequestHandler):
    """Ranges of BIG in 1,500-byte writes with a pause every 100 of them; `short_by` bytes of
    each body are never sent (the connection is closed instead)."""

    protocol_version = "HTTP/1.1"
    short_by = 0

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        first, last = (int(x) for x in self.headers["x-ms-range"].split("=")[1].split("-"))
        body = BIG[first : last + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Range", f"bytes {first}-{first + len(body) - 1}/{len(BIG)}")
        self.send_header("ETag", '"v1"')
        self.end_headers()
        sent = len(body) - TrickleHandler.short_by
        for i, at in enumerate(range(0, sent, PIECE)):
            self.wfile.write(body[at : min(at + PIECE, sent)])
            if i % 100 == 99:
                time.sleep(0.002)
        if TrickleHandler.short_by:
            self.close_connection = True


class Token:
    token, expires_on = "t", 2**40


class Credential:
    def get_token(self, *scopes: str, **kwargs: Any) -> Token:
        return Token()


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@pytest.fixture(params=["http", "https"])
def trickle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, ssl.SSLContext | None]]:
    """(account URL, the client's TLS context or None) of a trickling server on loopback."""
    TrickleHandler.short_by = 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), TrickleHandler)
    client: ssl.SSLContext | None = None
    if request.param == "https":
        cert, key = self_signed(tmp_path)
        server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_side.load_cert_chain(cert, key)
        httpd.socket = server_side.wrap_socket(httpd.socket, server_side=True)
        client = ssl.create_default_context(cafile=str(cert))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"{request.param}://127.0.0.1:{httpd.server_address[1]}/acct", client
    httpd.shutdown()
    httpd.server_close()


def lean(url: str, client: ssl.SSLContext | None, depth: int = 2) -> BlobReader:
    reader = BlobReader(
        url,
        Bearer(Credential()),
        chunk_size=1 << 20,
        depth=depth,
        timeout_s=5,
        retries=0,
        sleep=lambda s: None,
    )
    reader.connections.ssl_context = client  # trust the test's certificate (https), as a CA bundle would
    return reader


def test_the_ranges_fit_the_mark() -> None:
    """The test's ranges are long enough to be read under the mark (else it proves nothing)."""
    assert (1 << 20) - LOWAT_SLACK - LOWAT_BYTES > 0


def test_a_trickled_body_is_read_whole_and_the_connection_reused(
    trickle: tuple[str, ssl.SSLContext | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, client = trickle
    marks: list[int] = []
    real = blob_reader.set_lowat

    def spy(sock: Any, size: int) -> bool:
        ok = real(sock, size)
        marks.append(size if ok else -size)
        return ok

    monkeypatch.setattr(blob_reader, "set_lowat", spy)
    reader = lean(url, client, depth=1)  # one connection: each answer after a body read under the mark
    for _ in range(2):
        with reader.open("data", "big.bin") as stream:
            assert stream.read() == BIG
    assert marks == [LOWAT_BYTES, 1] * 6  # three full ranges a read; the short last one needs none
    assert reader.connections.idle() == 1


def test_a_body_cut_short_under_the_mark_fails_at_once_not_at_the_timeout(
    trickle: tuple[str, ssl.SSLContext | None],
) -> None:
    url, client = trickle
    TrickleHandler.short_by = LOWAT_BYTES // 2  # the peer closes with less than the mark still owed
    with pytest.raises(StorageThrottled) as failed:
        lean(url, client).read_range("data", "big.bin", 0, 1 << 20)
    assert "IncompleteRead" in str(failed.value) or "EOF" in str(failed.value), str(failed.value)
    assert "timed out" not in str(failed.value)


def test_the_mark_can_be_turned_off(trickle: tuple[str, ssl.SSLContext | None]) -> None:
    url, client = trickle
    reader = lean(url, client)
    reader.lowat = 0
    assert reader.read_range("data", "big.bin", 5, 1 << 20) == BIG[5 : 5 + (1 << 20)]
