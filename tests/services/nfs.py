"""NFS gateways for the tests: a job network's bridge holding its gateway address (what the
node service's `net.up` makes, here without taps or firewall) and nfs_ops' state in a private
directory, so real nfs-ganesha processes serve on it and are stopped by pid afterwards.

Why a bridge of our own: the gateway binds the job network's gateway address, which exists on
the node only while the job's bridge does; the tests need nothing else of the job network.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from provisioning import network
from provisioning.node_service import nfs_ops


def ganesha_missing() -> str:
    """Why a gateway cannot run here ("" when it can): ganesha installed, and root."""
    import os

    if os.geteuid() != 0:
        return "NFS gateways run as root (the node service)"
    if shutil.which("ganesha.nfsd") is None or not Path("/usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so").exists():
        return "nfs-ganesha and nfs-ganesha-vfs are not installed (deploy/bootstrap installs them)"
    return ""


@contextmanager
def job_bridge(rms: str, job: str) -> Iterator[int]:
    """The job's bridge with its gateway address (/24), removed afterwards; yields its subnetID."""
    subnet_id = network.pilot_subnet_id(rms, job)
    bridge = network.bridge_name(subnet_id)
    gateway = network.gateway_address(subnet_id)

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)

    subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=10, check=False)
    ip("link", "add", bridge, "type", "bridge")
    try:
        ip("addr", "add", f"{gateway}/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        yield subnet_id
    finally:
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=10, check=False)


@pytest.fixture
def nfs_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """nfs_ops' state directory in the test's own tmp dir; every gateway left is stopped."""
    missing = ganesha_missing()
    if missing:
        pytest.fail(f"{missing} (deploy/bootstrap installs it)")
    state = tmp_path / "nfs-state"
    monkeypatch.setattr(nfs_ops, "STATE_DIR", state)
    try:
        yield state
    finally:
        for job in sorted(state.glob("vjob-*")) if state.is_dir() else []:
            rec = nfs_ops.read_record(job)
            if rec is not None:
                nfs_ops.stop(rec.pid, job)
            nfs_ops.stop_unrecorded(job)
