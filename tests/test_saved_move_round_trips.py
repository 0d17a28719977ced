"""How many ssh sessions a saved VM's move between hosts costs (provisioning.saved_move).

Why counted: each remote operation is an ssh session (through a shared master still a process
on both ends, tenths of a second on a loaded node), and a move used to open one per question
(a `test -e` per optional file, a `stat` per copy's timeout, an rsync per log). The count is
asserted exactly, so it cannot grow back unnoticed, and so is what it must not trade away: every
file arrives whole, a copy that differs from the digests recorded at save time is refused
naming the file, nothing of it left at the destination.

Real ssh and rsync to the second host of tests/services/second_host.py (its own tmpfs); no
guest: the files are random bytes with a manifest, as a save writes them. Counted by wrapping
`vjob.proc.run`, which every ssh, rsync and scp of `provisioning.transfer` goes through.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioning import integrity, saved_move, transfer
from provisioning.vm_lifecycle import VMLifecycle
from provisioning.vm_types import Snapshot, SnapshotError
from tests.services.second_host import SecondHost, second_host  # noqa: F401 - fixture
from vjob import proc

pytestmark = pytest.mark.libvirt

VM = "vjob-move-count"
REMOTE_COMMANDS = ("ssh", "rsync", "scp")


@pytest.fixture(autouse=True, scope="module")
def _close_shared_connections() -> Iterator[None]:
    yield
    transfer.close_connections()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every ssh, rsync and scp run from now on (the real ones, run as before)."""
    calls: list[list[str]] = []
    real = proc.run

    def run(cmd: Any, **kw: Any) -> str:
        argv = [str(c) for c in cmd]
        if Path(argv[0]).name in REMOTE_COMMANDS:
            calls.append(argv)
        return real(cmd, **kw)

    monkeypatch.setattr(proc, "run", run)
    return calls


def _files(vms: VMLifecycle, node: str) -> dict[str, Path]:
    out, err = vms.output_logs(VM, node)
    return {
        "overlay": vms.overlay_path(VM, node),
        "job_disk": vms.job_disk_path(VM, node),
        "stdout": out,
        "stderr": err,
        "state": vms.state_path(VM, node),
    }


def _saved_on_b(host: SecondHost, vms: VMLifecycle, sizes: dict[str, int]) -> tuple[Snapshot, dict[str, Any]]:
    """A saved VM's files on b, random bytes, and its manifest as a save writes it."""
    files = _files(vms, "b")
    for role, path in files.items():
        host.run(f"head -c {sizes[role]} /dev/urandom > {path} && chmod 600 {path}")  # one remote shell line
    digests = {role: hashlib.sha256(host.read_bytes(path)).hexdigest() for role, path in files.items()}
    disks = {r: {"size_bytes": sizes[r], "sha256": digests[r]} for r in integrity.DISK_ROLES}
    manifest = {"vm": VM, "node": "b", "size_bytes": sizes["state"], "sha256": digests["state"], "disks": disks}
    integrity.write_manifest(files["state"], manifest, host.ssh_host)
    snap = Snapshot(VM, "b", "memory", files["state"], None, sizes["state"], digests["state"], 0.0, None)
    return snap, disks


def test_a_move_from_another_host_costs_six_ssh_sessions_and_keeps_every_check(
    second_host: SecondHost,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    counted: list[list[str]],
) -> None:
    cfg = second_host.provisioning("test:///default")  # a: this machine; its libvirt is not asked
    vms = VMLifecycle(cfg, data_dir=tmp_path)
    for node in ("a", "b"):
        vms.ensure_dirs(node)
    sizes = {"overlay": 3 << 20, "job_disk": 1 << 20, "stdout": 5000, "stderr": 700, "state": 4 << 20}
    snap, disks = _saved_on_b(second_host, vms, sizes)
    remote = {role: second_host.read_bytes(path) for role, path in _files(vms, "b").items()}
    try:
        counted.clear()
        saved_move.copy_checked(vms, VM, "b", "a", snap, disks)
        sessions = len(counted)
        for role, path in _files(vms, "a").items():
            assert path.read_bytes() == remote[role], role  # each file whole, where it belongs
            assert path.stat().st_mode & 0o777 == 0o600, role
        manifest = integrity.read_manifest(vms.state_path(VM, "a"))
        assert manifest is not None and manifest["sha256"] == snap.sha256
        assert sessions == saved_move.ROUND_TRIPS_REMOTE_SOURCE, "\n".join(" ".join(c)[:200] for c in counted)

        counted.clear()
        saved_move.drop_source(vms, VM, "b", "a")  # one `rm` for all of the source's files
        assert len(counted) == 1, counted
        assert not any(second_host.exists(p) for p in _files(vms, "b").values())

        # A job disk altered on b after the save: refused naming it, nothing kept on a
        for path in _files(vms, "a").values():
            path.unlink()
        snap, disks = _saved_on_b(second_host, vms, sizes)
        job_b = vms.job_disk_path(VM, "b")
        second_host.run(f"printf x | dd of={job_b} bs=1 seek=1000 conv=notrunc status=none")
        with pytest.raises(SnapshotError, match=rf"{job_b.name} is corrupt.*the snapshot on b is kept"):
            saved_move.copy_checked(vms, VM, "b", "a", snap, disks)
        for role in ("overlay", "job_disk", "state"):
            assert not _files(vms, "a")[role].exists(), role
        assert second_host.exists(job_b) and second_host.exists(vms.state_path(VM, "b"))
    finally:
        for node in ("a", "b"):
            for path in (*_files(vms, node).values(), integrity.manifest_path(vms.state_path(VM, node))):
                transfer.remove(vms.endpoint(path, node))
