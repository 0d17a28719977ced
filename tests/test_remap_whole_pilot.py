"""A multi-node pilot moves its job whole: one cut, every VM resumed on its own new node, or none.

A real pilot process (`vjob run --nodes node1,node2`, two counter-guest VMs, leader mode) over
libvirt's test driver with four nodes, asked as the agent asks (agent.pilot_coalesce's
WholeMovePerformer: a `suspend`, then one `resume` whose `nodes` name each VM's node in rank
order):
- the job moves onto node3, node4 (each state copied from where it slept and checked there,
  nothing left behind), then swaps its ranks' nodes on the way back (the VM directory is shared:
  libvirt's test driver cannot rewrite a saved domain's disk paths, real QEMU can:
  tests/test_multinode_transfer.py);
- the second VM's restore fails (node4's snapshot directory cannot be made): the first VM, back
  on node3 already, is saved again and copied back, and both run where they slept — no VM left
  half-moved; the refusal says so; the same move asked again once node4 is sound succeeds;
- a resume that names a node per VM but not the request's node first, or a node twice, is
  refused and the job sleeps on;
- ended by SIGTERM with its VMs away, the pilot saves them where they are and holds its own
  nodes (a partner's VMs may sit there) until the agent's `release`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioning.driver import Driver
from tests.services import wait_for
from tests.services.libvirt import make_test_node
from vjob.config import ProvisioningConfig
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, RequestKind

pytestmark = pytest.mark.libvirt
REPO = Path(__file__).resolve().parents[1]
JOB = "72"
VMS = ("vjob-slurm-72-0", "vjob-slurm-72-1")
ALL = ("node1", "node2", "node3", "node4")
FARM = """
[[subcluster]]
name = "any"
nodes = 4
cores_per_node = 1
memory_mb_per_node = 1024
freq_ghz = 1.0
"""


@pytest.fixture
def pilot(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], PilotDir, Driver, Path]]:
    uris = {n: make_test_node(tmp_path / "nodes", n) for n in ALL}
    conf = tmp_path / "vjob.toml"
    (tmp_path / "farm.toml").write_text(FARM)  # remapping on: the pilot holds its nodes for a lent VM
    conf.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[remap]\nfarm_file = "{tmp_path / "farm.toml"}"\npartner_hold_s = 20\n'
        '[provisioning]\ndefault_uri = "test:///default"\n'
        f'vm_dir = "{tmp_path / "vms"}"\nsnapshot_dir = "{tmp_path / "snap" / "{node}"}"\n'
        "[provisioning.nodes]\n" + "".join(f'{n} = "{u}"\n' for n, u in uris.items())
    )
    cmd = [sys.executable, "-m", "vjob.cli", "--config", str(conf), "run", "--job-id", JOB, "--node", "node1"]
    cmd += ["--nodes", "node1,node2", "--memory", "128"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cfg = ProvisioningConfig(nodes=uris, vm_dir=str(tmp_path / "vms"), snapshot_dir=str(tmp_path / "snap" / "{node}"))
    paths = Driver(cfg, data_dir=tmp_path / "data")  # for its paths only: never connects
    yield proc, PilotDir(tmp_path / "data" / "pilots", "slurm", JOB), paths, tmp_path
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def _ask(pdir: PilotDir, kind: RequestKind, rid: str, **kw: object) -> PilotStatus:
    pdir.request(kind, rid, **kw)  # type: ignore[arg-type]
    wait_for(lambda: pdir.answer_to(rid) is not None, 60, f"pilot answers {rid}")
    answer = pdir.answer_to(rid)
    assert answer is not None
    return answer


def _states(paths: Driver) -> dict[str, list[str]]:
    """Each VM → the nodes whose snapshot directory holds its saved state."""
    return {vm: [n for n in ALL if paths.state_path(vm, n).is_file()] for vm in VMS}


def _restored_on(err: str) -> list[list[str]]:
    """The nodes of each coordinated restore the pilot logged (its structured log, stderr)."""
    return [json.loads(line)["nodes"] for line in err.splitlines() if '"coordinated restore"' in line]


def _suspend(pdir: PilotDir, rid: str, nodes: list[str]) -> None:
    asleep = _ask(pdir, RequestKind.SUSPEND, rid)
    assert asleep.state is PilotState.SAVED and not asleep.request_error, asleep.request_error
    assert asleep.member_nodes == nodes


def test_a_multi_node_job_moves_whole_and_a_failed_second_resume_rolls_the_whole_cut_back(
    pilot: tuple[subprocess.Popen[str], PilotDir, Driver, Path],
) -> None:
    proc, pdir, paths, tmp = pilot
    wait_for(lambda: pdir.exists() and _running(pdir), 60, "pilot running")

    # The whole job onto node3, node4: one cut, one resume naming a node per VM.
    _suspend(pdir, "s1", ["node1", "node2"])
    assert _states(paths) == {VMS[0]: ["node1"], VMS[1]: ["node2"]}
    moved = _ask(pdir, RequestKind.RESUME, "r1", node="node3", from_node="node1", nodes=("node3", "node4"))
    assert not moved.request_error, moved.request_error
    assert (moved.state, moved.node, moved.member_nodes) == (PilotState.RUNNING, "node3", ["node3", "node4"])
    assert _states(paths) == {VMS[0]: [], VMS[1]: []}  # copied, checked, restored: nothing left behind

    # Refused before anything moves: the request's node not the first VM's, a node twice.
    _suspend(pdir, "s2", ["node3", "node4"])
    for rid, nodes in (("bad1", ("node2", "node1")), ("bad2", ("node1", "node1"))):
        refused = _ask(pdir, RequestKind.RESUME, rid, node="node1", from_node="node3", nodes=nodes)
        assert "one distinct node per VM" in refused.request_error, refused.request_error
        assert refused.state is PilotState.SAVED and refused.member_nodes == ["node3", "node4"]
    assert _states(paths) == {VMS[0]: ["node3"], VMS[1]: ["node4"]}
    # Home with the ranks crossed (a swap of the job's own nodes is a move too).
    back = _ask(pdir, RequestKind.RESUME, "r2", node="node2", from_node="node3", nodes=("node2", "node1"))
    assert not back.request_error and back.member_nodes == ["node2", "node1"], back.request_error

    # The second VM's restore fails: node4's snapshot directory is a file, so its state cannot
    # arrive there. The first VM reached node3 (restored paused), is saved again there and
    # copied back: both run again where they slept, and the pilot says the move was rolled back.
    _suspend(pdir, "s3", ["node2", "node1"])
    blocker = tmp / "snap" / "node4"
    shutil.rmtree(blocker, ignore_errors=True)
    blocker.write_text("not a directory")
    failed = _ask(pdir, RequestKind.RESUME, "r3", node="node3", from_node="node2", nodes=("node3", "node4"))
    assert "rolled back, every VM running where it slept" in failed.request_error, failed.request_error
    assert (failed.state, failed.node, failed.member_nodes) == (PilotState.RUNNING, "node2", ["node2", "node1"])
    assert _states(paths) == {VMS[0]: [], VMS[1]: []}  # both restored where they slept: no VM half-moved
    assert not (tmp / "snap" / "node3").exists() or not any((tmp / "snap" / "node3").iterdir())
    assert proc.poll() is None  # the pilot watches its running job again

    # node4 sound again: the same move goes through.
    blocker.unlink()
    _suspend(pdir, "s4", ["node2", "node1"])
    again = _ask(pdir, RequestKind.RESUME, "r4", node="node3", from_node="node2", nodes=("node3", "node4"))
    assert not again.request_error and again.member_nodes == ["node3", "node4"], again.request_error

    # The job ends (the RMS's SIGTERM) with its VMs on node3, node4: saved there in one cut, its
    # pilot holds its own nodes (node1, node2 may host a partner's VMs) until the agent releases it.
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: (pdir.read_state() or again).state is PilotState.SAVED, 60, "saved on SIGTERM")
    assert _states(paths) == {VMS[0]: ["node3"], VMS[1]: ["node4"]}
    time.sleep(0.5)
    assert proc.poll() is None  # holding
    pdir.request(RequestKind.RELEASE, "release-1")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "holding node1,node2" in out and "not released" not in out, out
    # Every VM restored where each request said, the failed attempt's rollback included.
    assert _restored_on(err) == [["node3", "node4"], ["node2", "node1"], ["node2", "node1"], ["node3", "node4"]], err
    assert err.count('"job moved"') == 3, err  # r1, r2, r4: each one cut


def _running(pdir: PilotDir) -> bool:
    st = pdir.read_state()
    return st is not None and st.state is PilotState.RUNNING
