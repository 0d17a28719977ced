"""The pieces of the two-host work that need no cluster (issue 38; docs/multinode.md, "Two hosts").

- the topology's plan and slurm.conf: `--hosts 2` deals node1,3,5,7 / node2,4,6,8 to two addresses
  and puts the controller on the hosts' bridge, while the one-host slurm.conf is byte for byte
  what it was (a running one-host cluster is not reconfigured by this change);
- an ordinary user's pilot with `[provisioning] user_vm_dir`: its VMs under the node-local
  directory of its own name, the site's `hosts` and copy method kept, its own node this machine;
  its session libvirt pointed at that directory; without the key, the home as before;
- the restarted pilot restores a state its file says was saved on another node, whose path is
  not a file here, and only that.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from types import SimpleNamespace

import pytest

from devkit.devcluster_files import slurm_conf
from devkit.devcluster_hosts import CONTROLLER_ADDR, plan
from pilot import specs
from pilot.pilot import Pilot
from vjob.config import ProvisioningConfig
from vjob.errors import VjobError
from vjob.pilot_files import PilotState, PilotStatus

ONE_HOST_NODE_LINE = (
    "NodeName=node[1-8] NodeHostname={host} NodeAddr=127.0.0.1 Port=[17001-17008] CPUs=4 Boards=1 "
    "SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=4096 State=UNKNOWN"
)


def _conf(hosts: int) -> str:
    return slurm_conf(
        Path("/r"),
        nodes=8,
        cpus=4,
        memory_mb=4096,
        port=6817,
        first_node_port=17001,
        hosts=plan(hosts, 8) if hosts > 1 else None,
    )


def test_two_hosts_split_the_nodes_and_one_host_keeps_its_slurm_conf() -> None:
    a, b = plan(2, 8)
    assert (a.name, a.address, a.nodes) == ("hosta", "198.18.250.11", ("node1", "node3", "node5", "node7"))
    assert (b.name, b.address, b.nodes) == ("hostb", "198.18.250.12", ("node2", "node4", "node6", "node8"))
    one = _conf(1)
    host = one.split("SlurmctldHost=", 1)[1].split("(", 1)[0]
    assert f"SlurmctldHost={host}(127.0.0.1)\n" in one
    assert ONE_HOST_NODE_LINE.format(host=host) + "\n" in one
    two = _conf(2)
    assert f"SlurmctldHost={host}({CONTROLLER_ADDR})\n" in two
    for n in range(1, 9):  # interleaved: a job resumed on the next nodes can start on the other host
        assert f"NodeName=node{n} NodeHostname={host} NodeAddr=198.18.250.{12 - n % 2} Port={17000 + n} " in two
    assert "127.0.0.1" not in two.replace("AccountingStorageHost=127.0.0.1", "")  # slurmdbd: the controller's
    with pytest.raises(VjobError, match="split evenly"):
        plan(3, 8)


@pytest.fixture
def as_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The pilot's process seen as uid 4242 named `alice`, its home under tmp_path."""
    monkeypatch.setattr(specs.os, "geteuid", lambda: 4242)
    fake = SimpleNamespace(pw_name="alice", pw_uid=4242, pw_dir=str(tmp_path / "home"))
    monkeypatch.setattr(pwd, "getpwuid", lambda _uid: fake)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    for var in ("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, f"/elsewhere/{var}")  # restored by monkeypatch after the test
    return tmp_path


def test_a_user_pilot_keeps_its_vms_on_the_nodes_own_disk_and_copies_them_as_the_user(as_user: Path) -> None:
    local = as_user / "local"
    local.mkdir(mode=0o1777)
    (local / "alice").mkdir(mode=0o700)  # as alice's first pilot makes it (the test runs as root)
    os.chown(local / "alice", 4242, 4242)
    site = ProvisioningConfig(
        user_vm_dir=f"{local}/{{user}}",
        copy_method="rsync",
        hosts={"node1": "hosta", "node5": "hostb"},
        vm_dir="/var/lib/vjob/vms",
    )
    prov = specs.user_provisioning(site, "node5")
    assert prov.default_uri == "qemu:///session" and prov.nodes == {}
    assert (prov.vm_dir, prov.snapshot_dir) == (f"{local}/alice/vms", f"{local}/alice/snapshots")
    assert prov.copy_method == "rsync" and prov.hosts == {"node1": "hosta", "node5": ""}  # its own node: here
    assert (local / "alice").stat().st_mode & 0o777 == 0o700
    specs.node_local_session(prov)
    assert os.environ["XDG_RUNTIME_DIR"] == f"{local}/alice/s/r"
    assert (
        os.environ["XDG_CONFIG_HOME"] == f"{local}/alice/s/c" and os.environ["XDG_CACHE_HOME"] == f"{local}/alice/s/h"
    )
    # without the key: the home, one filesystem, nothing touched in the environment
    home = specs.user_provisioning(ProvisioningConfig(copy_method="rsync", hosts={"node1": "hosta"}), "node5")
    assert home.vm_dir == f"{as_user}/home/.local/share/vjob/vms" and home.copy_method == "local"
    os.environ["XDG_CONFIG_HOME"] = "/elsewhere/XDG_CONFIG_HOME"
    specs.node_local_session(home)
    assert os.environ["XDG_CONFIG_HOME"] == "/elsewhere/XDG_CONFIG_HOME"


@pytest.mark.parametrize(
    ("state", "saved_node", "path", "restored"),
    [
        (PilotState.SAVED, "node1", "/nowhere/here/vjob-slurm-7.state", True),  # host A's own disk
        (PilotState.SAVED, "node5", "/nowhere/here/vjob-slurm-7.state", False),  # this node: must exist here
        (PilotState.SAVED, "node1", "", False),  # never saved
        (PilotState.RUNNING, "node1", "/nowhere/here/vjob-slurm-7.state", False),  # died running: boots
    ],
)
def test_a_state_saved_on_another_nodes_own_disk_is_restored_from_there(
    state: PilotState, saved_node: str, path: str, restored: bool
) -> None:
    previous = PilotStatus(
        job_id="7",
        vm="vjob-slurm-7",
        node=saved_node,
        uri="qemu:///session",
        state=state,
        since=0.0,
        saved_node=saved_node,
        memory_path=path,
    )
    me = SimpleNamespace(s=SimpleNamespace(node="node5"))
    assert Pilot._saved_elsewhere(me, previous) is restored  # type: ignore[arg-type]
