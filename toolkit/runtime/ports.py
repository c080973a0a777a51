"""Who holds a TCP port on this machine: a listener, or only the local end of a connection.

The local backend checks a plan's ports before it starts anything. A port can be taken two ways, and they need
different advice: a process *listens* on it (an orphaned server, another deployment: stop it), or it is the
local end of a connection (an outgoing connection whose source port the kernel picked from its ephemeral range,
net.ipv4.ip_local_port_range): nothing listens, nothing is to be stopped, the port frees itself when the
connection closes, and ports outside the ephemeral range never meet this. A server binding such a port fails
all the same (Linux refuses bind(2) on a port a connected socket holds, SO_REUSEADDR or not), so both are
reported; only the wording differs. Linux only (/proc/net/tcp*); elsewhere nothing is known to listen.
"""

from __future__ import annotations

import socket
from pathlib import Path

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_MAX_TABLE_BYTES = 64 << 20


def listening_ports(tables: tuple[str, ...] = _TABLES) -> set[int]:
    """The TCP ports something listens on, on any address of this machine (from /proc/net/tcp and tcp6)."""
    out: set[int] = set()
    for table in tables:
        try:
            with open(table, "rb") as f:
                text = f.read(_MAX_TABLE_BYTES).decode(errors="replace")
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == _LISTEN:
                try:
                    out.add(int(fields[1].rsplit(":", 1)[1], 16))
                except (IndexError, ValueError):
                    continue
    return out


def bindable(port: int) -> bool:
    """A server could bind the port now, on every address (SO_REUSEADDR, as servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int] | None:
    """The kernel's range of source ports for outgoing connections, where it can be read."""
    try:
        low, high = Path(path).read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return None


__all__ = ["bindable", "ephemeral_range", "listening_ports"]
