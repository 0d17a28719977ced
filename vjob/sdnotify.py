"""systemd's notify protocol (sd_notify) without a dependency: one datagram to $NOTIFY_SOCKET.

Why: the shipped units are `Type=notify` with a watchdog, so systemd knows when a daemon is
really ready (store, adapter and exporter up) and restarts one whose loop hangs. The protocol
is a single AF_UNIX datagram of `KEY=VALUE` lines (man sd_notify); libsystemd is not needed
for that. Outside systemd ($NOTIFY_SOCKET unset) every call does nothing, and a notification
that cannot be sent is never fatal: the daemon's work matters more than its supervisor.
Nor may it wait: a datagram socket whose reader is slow or gone fills its queue, and a
blocking send then stops the daemon's loop (a node service whose notify socket nobody read
stopped answering after about ten watchdog pings), so the send never blocks and a full queue
drops the notification.
"""

from __future__ import annotations

import os
import socket

from vjob import log


class Notifier:
    """Sends READY/WATCHDOG/STATUS/STOPPING to the service manager, when there is one."""

    def __init__(self, address: str | None = None) -> None:
        raw = os.environ.get("NOTIFY_SOCKET", "") if address is None else address
        # "@name" is an abstract socket: its first byte is NUL on the wire.
        self.address = "\0" + raw[1:] if raw.startswith("@") else raw
        self.enabled = bool(raw) and (raw.startswith(("/", "@")))

    def send(self, *fields: str) -> bool:
        """Send `KEY=VALUE` fields in one datagram; False when not under systemd or it failed."""
        if not self.enabled:
            return False
        message = "\n".join(f.replace("\n", " ") for f in fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
                sock.connect(self.address)
                sock.send(message)
            return True
        except OSError as exc:
            log.get("sdnotify").warning("cannot notify systemd", socket=self.address, error=str(exc))
            return False

    def ready(self, status: str = "") -> bool:
        """The daemon is up: systemd's start job completes."""
        return self.send("READY=1", f"MAINPID={os.getpid()}", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        """The loop made progress: call after every iteration (a hang misses it, systemd restarts)."""
        return self.send("WATCHDOG=1")

    def status(self, text: str) -> bool:
        """A one-line status shown by `systemctl status`."""
        return self.send(f"STATUS={text}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")


__all__ = ["Notifier"]
