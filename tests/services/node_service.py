"""A real `vjob node-service` for the tests, next to the Slurm development cluster.

Once per session: the service runs as root (as the systemd unit runs it), serves the cluster's
node names (node1..node8 of this one machine), asks the cluster's slurmctld, and listens on a
socket in a temporary 0755 directory. It is ready when it sends READY=1 on a notify socket of
the fixture's own (the sd_notify path the unit relies on), and stopped by pid at the end.

How a test points a pilot (an ordinary user) at it: run the pilot with
`VJOB_CONFIG=<node_service.config_path>`; that file is the cluster's vjob.toml plus
`[node] socket = "<node_service.socket>"`, readable by every user. Modules that use it import
the fixture: `from tests.services.node_service import node_service  # noqa: F401`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devkit.devcluster import DevCluster

REPO = Path(__file__).resolve().parents[2]
READY_WITHIN_S = 30.0


@dataclass(frozen=True)
class NodeServiceProcess:
    pid: int
    socket: Path
    config_path: Path
    """A site vjob.toml (0644) with `[node] socket` set: VJOB_CONFIG for pilots and clients."""
    names: tuple[str, ...]
    log: Path


def site_config(cluster: DevCluster, sock: Path, names: list[str], guest: str = 'network = "none"') -> str:
    """The cluster's configuration with the service's `[node]` section and `[guest]` (`guest`:
    its lines). Why "none" by default: under "nat" a guest reaches whatever this machine routes
    to and is handed its name servers; tests send traffic only to loopback and to namespaces
    they make, so a test that wants the site says so (`network = "nat"` and a namespace's `dns`)."""
    base = (cluster.etc / "vjob.toml").read_text()
    listed = ", ".join(f'"{n}"' for n in names)
    # no sweep: the tests run a service of their own beside the session's, and one service's
    # sweep reaps the other's job networks and gateways (one service per node in production)
    node = f'[node]\nsocket = "{sock}"\nnames = [{listed}]\nrms = "slurm"\nsweep_interval_s = 0\n'
    return f"{base.rstrip()}\n\n{node}\n[guest]\n{guest}\n"


@contextlib.contextmanager
def running(
    cluster: DevCluster, guest: str = 'network = "none"', prefix: str = "vjob-nodeservice-"
) -> Iterator[NodeServiceProcess]:
    """A `vjob node-service` of its own for the cluster, with `[guest]` lines `guest` (a test of
    the site's network or filesystems needs its own): started, waited for (READY=1), stopped by
    pid at the end, its log's tail printed then (pytest shows it when the test failed)."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    work.chmod(0o755)
    sock = work / "run" / "node.sock"
    names = cluster.node_names() or [f"node{i}" for i in range(1, 9)]
    config = work / "vjob.toml"
    config.write_text(site_config(cluster, sock, names, guest))
    config.chmod(0o644)
    notify_path = work / "notify"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    log = work / "service.log"
    env = {**os.environ, **cluster.env, "VJOB_CONFIG": str(config), "NOTIFY_SOCKET": str(notify_path)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vjob.cli", "node-service"], env=env, cwd=REPO, stdout=out, stderr=out
        )
    try:
        _wait_ready(notify, proc, log)
        drain = threading.Thread(target=_drain, args=(notify,), daemon=True)  # as systemd reads on
        drain.start()
        yield NodeServiceProcess(proc.pid, sock, config, tuple(names), log)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        notify.close()
        print(log.read_text(errors="replace")[-3000:])
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def node_service(slurm_cluster: DevCluster) -> Iterator[NodeServiceProcess]:
    """The running service (see the module docstring), `[guest] network = "none"`."""
    with running(slurm_cluster) as service:
        yield service


def _drain(notify: socket.socket) -> None:
    """Read the service's watchdog pings until the socket is closed at the end."""
    notify.settimeout(None)
    with contextlib.suppress(OSError):
        while notify.recv(4096):
            pass


def _wait_ready(notify: socket.socket, proc: subprocess.Popen[bytes], log: Path) -> None:
    end = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"vjob node-service exited with {proc.returncode}: {log.read_text()[-2000:]}")
        notify.settimeout(0.5)
        try:
            if b"READY=1" in notify.recv(4096):
                return
        except TimeoutError:
            continue
    raise RuntimeError(f"vjob node-service not ready within {READY_WITHIN_S} s: {log.read_text()[-2000:]}")
