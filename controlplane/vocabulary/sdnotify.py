"""systemd's readiness protocol (Type=notify), its few lines: a datagram of `KEY=VALUE` lines
to the socket named in NOTIFY_SOCKET (`@name`: the abstract namespace). Nothing happens when
the process was not started by systemd. The router keeps its own copy (router/sdnotify.py):
the control plane and the router share no code."""

from __future__ import annotations

import asyncio
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


def watchdog_period() -> float | None:
    """Half the WatchdogSec= systemd gave this service (WATCHDOG_USEC), or None without one.
    WATCHDOG_PID names the main process; its forked workers, which inherit it, feed it too."""
    usec, pid = os.environ.get("WATCHDOG_USEC", ""), os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid.isdigit() and int(pid) not in (os.getpid(), os.getppid()):
        return None
    return int(usec) / 2e6


async def feed_watchdog() -> None:
    """WATCHDOG=1 every half period, from the event loop that does the work: a loop that
    freezes stops feeding it, and systemd restarts the service."""
    period = watchdog_period()
    if period is None:
        return
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(period)
