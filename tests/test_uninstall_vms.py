"""`vjob uninstall` with vjobs' VMs on the nodes: refused while one runs, `--force` drains and
removes both VMs, their files and rows, the deployed files, and keeps the store.

The VMs are libvirt test-driver domains on `test:///default`, which one process shares between
its connections: the test keeps a connection open, so the domains the command deletes through
its own Driver are gone from the test's view too (that is why the command runs in-process,
through `vjob.cli.main`). Their files are real: overlays over a real qcow2 image, job disks, a
saved memory state with its manifest, in VM and snapshot directories outside data_dir (so only
the driver's delete, not the emptying of data_dir, can remove them).

The resource manager is Torque on the recorded-output stand-ins (tests/pbs_standins.py: Torque
cannot run here): the recorded KU Leuven `qstat -f` with one job running (a vjob: its pilot
directory is there) and one held after vjob's checkpoint (its VM saved). The drain `--force`
does first must release the held job (`qrls -h u`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import libvirt
import pytest
from sqlalchemy import func, select

from provisioning.driver import Driver, VMSpec
from provisioning.integrity import manifest_path
from tests.pbs_standins import StandIns
from tests.test_drain_pbs import _held
from tests.test_pbs_agent import BATCH, RUNNING, _records
from vjob.cli import main
from vjob.config import Config, load
from vjob.model import Job, JobState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, pilot_root
from vjob.store import jobs as store_jobs
from vjob.store import vms as store_vms
from vjob.store.db import Store
from vjob.store.schema import JobRecord, VMRecord

pytestmark = pytest.mark.libvirt

ROOT = Path(__file__).resolve().parent.parent
URI = "test:///default"
NODES = ("r22i13n01", "r22i13n02")
INSTALLED = ("agent-unit", "node-unit", "man-page", "torque-filter", "pbs-config")


def _deploy(conf: Path, root: Path) -> None:
    cmd = [sys.executable, "-m", "vjob.cli", "--config", str(conf), "deploy", "install", "--root", str(root)]
    env = dict(os.environ)
    res = subprocess.run([*cmd, *INSTALLED], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr


def _uninstall(conf: Path, root: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    """`vjob uninstall` in this process (the test driver's domains are this process's)."""
    capsys.readouterr()
    code = main(["--config", str(conf), "uninstall", "--root", str(root), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}


def _make_vm(driver: Driver, store: Store, job: Job, vm: str, node: str, image: Path) -> list[Path]:
    """A vjob's VM as the agent leaves it: recorded for its job, overlay and job disk, booted."""
    disk = driver.job_disk_path(vm, node)
    driver.ensure_dirs(node)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "16M"], check=True, timeout=30)
    driver.define(VMSpec(vm, image, job_disk=disk), node)
    driver.boot(vm, node)
    store_vms.remember(store, "pbs", job, vm=vm, node=node)
    return [driver.overlay_path(vm, node), disk]


def _vjobs_vms(cfg: Config, store: Store, image: Path, victim: str) -> list[Path]:
    """The running vjob's VM (booted) and the checkpointed one's (saved: state file and
    manifest), each with its pilot directory as its pilot leaves it; their files."""
    driver = Driver(cfg.provisioning, data_dir=cfg.data_path)
    try:
        running = Job(RUNNING, "alice", rms="pbs", state=JobState.RUNNING)
        saved = Job(victim, "bob", rms="pbs", state=JobState.SUSPENDED)
        run_vm, saved_vm = (PilotDir(pilot_root(cfg), "pbs", j.id).vm for j in (running, saved))
        files = _make_vm(driver, store, running, run_vm, NODES[0], image)
        files += _make_vm(driver, store, saved, saved_vm, NODES[1], image)
        driver.save(saved_vm, NODES[1])
        state = driver.state_path(saved_vm, NODES[1])
        files += [state, manifest_path(state)]
        store_jobs.record_preemption(store, "pbs", victim)
        for job, pstate, node in ((running, PilotState.RUNNING, NODES[0]), (saved, PilotState.SAVED, NODES[1])):
            pdir = PilotDir(pilot_root(cfg), "pbs", job.id)
            pdir.ensure()
            status = PilotStatus(job_id=job.id, vm=pdir.vm, node=node, uri=URI, state=pstate, since=0.0)
            pdir.write_state(status)
        return files
    finally:
        driver.close()


def test_uninstall_refuses_then_force_removes_the_vms(
    tmp_path: Path, shared_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    data = root / "var/lib/vjob"
    standins = StandIns(tmp_path / "bin")
    torque = shared_dir / "data" / "fixtures" / "torque"
    recorded = _records((torque / "vsc_qstat_full.txt").read_text(), [*BATCH, RUNNING])
    victim = BATCH[0]
    qstat = tmp_path / "qstat.txt"
    qstat.write_text(_held(recorded, victim))  # as after vjob's checkpoint of the victim
    standins.script("qstat", stdout_file=qstat)
    standins.script("pbsnodes", stdout_file=torque / "vsc_pbsnodes_thinking.txt")
    nodes = ", ".join(f'{n} = "{URI}"' for n in NODES)
    conf = tmp_path / "vjob.toml"
    conf.write_text(
        f'data_dir = "{data}"\n[agent]\nrms = "pbs"\n'
        f'[pbs]\ndialect = "torque"\ntorque_format = "text"\nbin_dir = "{standins.dir}"\n'
        f'[node]\nsocket = "{root / "run/vjob/node.sock"}"\n'
        f'[provisioning]\nnodes = {{ {nodes} }}\nvm_dir = "{tmp_path / "vms/{node}"}"\n'
        f'snapshot_dir = "{tmp_path / "snap/{node}"}"\noperation_timeout_s = 30\n'
    )
    _deploy(conf, root)
    deployed = _files(root) - {"var/lib/vjob/deployed.json"}
    assert len(deployed) == len(INSTALLED), deployed
    cfg = load(conf)
    store = Store(cfg.database_url)
    store.upgrade()
    image = tmp_path / "images/base.qcow2"
    image.parent.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=30)

    run_vm, saved_vm = (PilotDir(pilot_root(cfg), "pbs", j).vm for j in (RUNNING, victim))
    vms = {run_vm, saved_vm}
    held_view = libvirt.open(URI)  # keeps test:///default's domains alive and lets us look at them
    try:
        vm_files = _vjobs_vms(cfg, store, image, victim)
        assert vms <= {d.name() for d in held_view.listAllDomains()}
        assert held_view.lookupByName(run_vm).isActive()
        assert not held_view.lookupByName(saved_vm).isActive()
        assert all(p.is_file() for p in vm_files), vm_files

        code, out, err = _uninstall(conf, root, capsys)
        assert code == 1, out + err
        assert f"vjobs still run: {RUNNING}" in err and "--force" in err, err
        assert out == ""
        assert vms <= {d.name() for d in held_view.listAllDomains()}  # nothing touched
        assert all(p.is_file() for p in vm_files) and deployed <= _files(root)
        assert not [c for c in standins.calls() if c[0] != "qstat"]  # not drained either

        code, out, err = _uninstall(conf, root, capsys, "--force", "--json")
        assert code == 0, out + err
        done = json.loads(out)
        assert done["failed"] == [], done
        assert "not under systemd here (or --root): the unit files were removed, nothing was stopped" in err
        assert "drained first (1 checkpointed jobs released)" in done["notes"], done["notes"]
        assert ["qrls", "-h", "u", victim] in standins.calls()
        assert not vms & {d.name() for d in held_view.listAllDomains()}  # undefined, the running one destroyed
        assert [p for p in vm_files if p.exists()] == []
        assert sum(1 for r in done["removed"] if r.startswith("VM ")) == 2, done["removed"]
        with store.session() as s:
            assert s.scalar(select(func.count()).select_from(VMRecord)) == 0
            assert s.scalar(select(func.count()).select_from(JobRecord)) >= 2  # the history stays
        store.close()
        sidecars = {"var/lib/vjob/vjob.sqlite-wal", "var/lib/vjob/vjob.sqlite-shm"}  # the store's own, kept with it
        assert _files(root) - sidecars == {"var/lib/vjob/vjob.sqlite"}, _files(root)  # manifest: gone with its entries
        assert not pilot_root(cfg).exists()
        assert any("state store" in k for k in done["kept"])

        code, out, err = _uninstall(conf, root, capsys, "--purge-store")  # no vjob runs any more
        assert code == 0, out + err
        assert _files(root) == set(), _files(root)
    finally:
        store.close()
        for dom in held_view.listAllDomains():  # whatever a failure left of ours
            if dom.name() in vms:
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
        held_view.close()
