"""sd_notify without libsystemd: READY, WATCHDOG, STATUS, STOPPING.

Under systemd (``Type=notify``) ``NOTIFY_SOCKET`` names a unix datagram socket;
elsewhere every call is a no-op. ``WATCHDOG_USEC`` (set with ``WatchdogSec=``)
tells how often the service must ping; we ping at half that period.
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd; False when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(address)
            sock.sendall(state.encode())
        except OSError:
            return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half the configured timeout), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 1_000_000 / 2
