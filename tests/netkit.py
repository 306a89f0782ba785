"""Stand-ins for the outside world of an outbound call, for tests of the guard and the `http` kind.

- `TestCA` (`test_ca` fixture): a certificate authority made in the test (cryptography); `.issue(names)`
  is a server certificate for those names, `.bundle` the CA file a client trusts (`verify=`).
- `TlsReceiver`: the kit's `Receiver` speaking TLS with such a certificate, on 127.0.0.1 (free port).
- `RawDownstream`: a server on 127.0.0.1 that reads a request and writes scripted bytes as they
  are (malformed headers included), recording what it read.
- `ScriptedResolver`: the resolver the guard uses, answering what the test says (OSError otherwise)
  and noting each name asked.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import socket
import ssl
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.handlerkit import Receiver


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class TestCA:
    """A CA made now; its certificate is written to `bundle` in `folder`."""

    __test__ = False

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name("kit test CA"))
            .issuer_name(_name("kit test CA"))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(self.key, hashes.SHA256())
        )
        self.bundle = str(folder / "ca.pem")
        Path(self.bundle).write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self._issued = 0

    def issue(self, names: Sequence[str]) -> tuple[str, str]:
        """A server certificate for `names` (host names or addresses): (cert file, key file)."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = []
        for name in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(names[0]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self._issued += 1
        cert_file = self.folder / f"server{self._issued}.pem"
        key_file = self.folder / f"server{self._issued}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(_pem_key(key))
        return str(cert_file), str(key_file)


class TlsReceiver(Receiver):
    """The kit's scripted receiver over TLS, with a certificate of `ca` for `names`."""

    def __init__(self, ca: TestCA, names: Sequence[str]) -> None:
        super().__init__()
        cert, key = ca.issue(names)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.port}{path}"


class RawDownstream:
    """A server on 127.0.0.1 (free port): each connection's request is read and recorded, then
    the next scripted answer (bytes, as they are) is written and the connection closed."""

    def __init__(self, *answers: bytes) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                except OSError:
                    pass
                self.requests.append(data)
                answer = (
                    self.answers.pop(0) if self.answers else b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
                )
                with contextlib.suppress(OSError):
                    conn.sendall(answer)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def allow(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=2)


class ScriptedResolver:
    """Answers each name with the addresses the test gave (OSError for any other name)."""

    def __init__(self, answers: Mapping[str, Sequence[str]]) -> None:
        self.answers = {k.lower(): list(v) for k, v in answers.items()}
        self.asked: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        found = self.answers.get(host.lower())
        if found is None:
            raise socket.gaierror(socket.EAI_NONAME, f"{host}: not in the script")
        return list(found)
