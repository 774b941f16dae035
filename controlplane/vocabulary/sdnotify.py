"""systemd's readiness protocol (Type=notify), its few lines: a datagram of `KEY=VALUE` lines
to the socket named in NOTIFY_SOCKET (`@name`: the abstract namespace). Nothing happens when
the process was not started by systemd. The router keeps its own copy (router/sdnotify.py):
the control plane and the router share no code."""

from __future__ import annotations

import os
import socket


def notify(*states: str) -> bool:
    """Send `states` (READY=1 once serving, STOPPING=1 when beginning to stop, STATUS=...);
    whether a socket was there to take them."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto("\n".join(states).encode(), address)
    except OSError:
        return False
    return True
