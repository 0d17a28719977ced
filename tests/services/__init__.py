"""Start-on-demand real services for the tests, each started once per run and stopped by pid.

Why here and not in a fixture file per test: several test modules (and benchmarks) share one
PostgreSQL, one Slurm cluster, one libvirtd; starting them once per run keeps CI near 20
minutes. A service already running (a developer's own) is used as it is and never stopped.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from vjob.proc import stop_pid

__all__ = ["free_port", "port_open", "stop_pid", "wait_for"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    """Poll `predicate` until it holds; raise naming `what` when `timeout` runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s")
