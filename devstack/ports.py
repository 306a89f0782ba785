"""Free-port helpers for servers bound to loopback."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> tuple[int, ...]:
    """`count` distinct TCP ports on 127.0.0.1, free right now (all held open while choosing:
    `free_port()` twice can return the same port)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return tuple(int(sock.getsockname()[1]) for sock in socks)
    finally:
        for sock in socks:
            sock.close()


def wait_for_port(port: int, timeout_s: float = 30.0, host: str = "127.0.0.1") -> None:
    """Block until something accepts connections on host:port, or raise TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s:.0f}s")


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process `pid` holds the socket listening on 127.0.0.1:`port` (Linux /proc); None
    where /proc cannot tell. A port that answers may be another process's."""
    table = Path("/proc/net/tcp")
    try:
        lines = table.read_text(encoding="ascii").splitlines()[1:]
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    wanted = f"0100007F:{port:04X}"
    rows = (line.split() for line in lines)  # sl, local, remote, state (0A: LISTEN), ..., inode
    inodes = {row[9] for row in rows if row[1] == wanted and row[3] == "0A"}
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False
