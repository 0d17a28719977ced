"""Live context-switch requests to a multi-node pilot: one cut for all its VMs, or a refusal.

A real pilot process (`vjob run --nodes node1,node2`, two counter-guest VMs) over libvirt's
test driver, asked as the agent asks (pilot.switch_requests, test_planner_live.py):
- `suspend` saves both VMs in one coordinated cut (the state files of both, the pilot's
  `multi-node job saved` line says consistent), `resume` in place restores both;
- a `resume` on another node or from another node's state, and a live `migrate`, would move
  the job's VMs one by one: refused with a clear `request_error`, nothing moved, the job still
  asleep (or running) as it was;
- `stop` deletes every VM of the job, not only the first.
The test driver's VMs live in the pilot's process; what the test sees is the pilot's state
file, its log and the files on each node's directories.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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
JOB = "71"
VMS = ("vjob-slurm-71-0", "vjob-slurm-71-1")
NODES = ("node1", "node2")


@pytest.fixture
def pilot(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], PilotDir, Driver]]:
    uris = {n: make_test_node(tmp_path / "nodes", n) for n in ("node1", "node2", "node3")}
    conf = tmp_path / "vjob.toml"
    conf.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[provisioning]\ndefault_uri = "test:///default"\n'
        f'vm_dir = "{tmp_path / "vms" / "{node}"}"\nsnapshot_dir = "{tmp_path / "snap" / "{node}"}"\n'
        "[provisioning.nodes]\n" + "".join(f'{n} = "{u}"\n' for n, u in uris.items())
    )
    cmd = [
        sys.executable,
        "-m",
        "vjob.cli",
        "--config",
        str(conf),
        "run",
        "--job-id",
        JOB,
        "--node",
        "node1",
        "--nodes",
        ",".join(NODES),
        "--memory",
        "128",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cfg = ProvisioningConfig(
        nodes=uris, vm_dir=str(tmp_path / "vms" / "{node}"), snapshot_dir=str(tmp_path / "snap" / "{node}")
    )
    paths = Driver(cfg, data_dir=tmp_path / "data")  # for its paths only: never connects
    yield proc, PilotDir(tmp_path / "data" / "pilots", "slurm", JOB), paths
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def _state(pdir: PilotDir) -> PilotStatus:
    st = pdir.read_state()
    assert st is not None
    return st


def _ask(pdir: PilotDir, kind: RequestKind, rid: str, **kw: str) -> PilotStatus:
    pdir.request(kind, rid, **kw)
    wait_for(lambda: pdir.answer_to(rid) is not None, 30, f"pilot answers {rid}")
    answer = pdir.answer_to(rid)
    assert answer is not None
    return answer


def _states(paths: Driver) -> list[bool]:
    return [paths.state_path(vm, node).is_file() for vm, node in zip(VMS, NODES, strict=True)]


def test_a_multi_node_pilot_suspends_and_resumes_all_its_vms_and_refuses_to_move_them_one_by_one(
    pilot: tuple[subprocess.Popen[str], PilotDir, Driver],
) -> None:
    proc, pdir, paths = pilot
    wait_for(lambda: pdir.exists() and _state(pdir).state is PilotState.RUNNING, 60, "pilot running")
    assert all(paths.overlay_path(vm, node).is_file() for vm, node in zip(VMS, NODES, strict=True))

    moved = _ask(pdir, RequestKind.MIGRATE, "m1", node="node3")
    assert "live migration to node3 refused: a multi-node job (VMs on node1, node2)" in moved.request_error
    assert moved.state is PilotState.RUNNING and moved.node == "node1"

    asleep = _ask(pdir, RequestKind.SUSPEND, "s1")
    assert asleep.state is PilotState.SAVED and not asleep.request_error
    assert asleep.member_nodes == list(NODES) and _states(paths) == [True, True]  # both VMs saved, each on its node

    for rid, kw in (("r1", {"node": "node3"}), ("r2", {"node": "node1", "from_node": "node2"})):
        refused = _ask(pdir, RequestKind.RESUME, rid, **kw)
        assert "refused: a multi-node job" in refused.request_error and "not moved VM by VM" in refused.request_error
        assert refused.state is PilotState.SAVED and _states(paths) == [True, True]  # still asleep, both states kept

    back = _ask(pdir, RequestKind.RESUME, "r3", node="node1")
    assert (back.state, back.node, back.restores, back.request_error) == (PilotState.RUNNING, "node1", 1, "")
    assert _states(paths) == [False, False]  # both restored (a state is dropped once its VM runs)

    stopped = _ask(pdir, RequestKind.STOP, "x1")
    assert stopped.state is PilotState.FINISHED
    assert proc.wait(timeout=30) == 0
    assert not any(paths.overlay_path(vm, node).exists() for vm, node in zip(VMS, NODES, strict=True))

    _out, err = proc.communicate(timeout=30)
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    saved = [e for e in events if e.get("event") == "multi-node job saved"]
    restored = [e for e in events if e.get("event") == "multi-node job restored"]
    cuts = [e for e in events if e.get("event") == "coordinated checkpoint"]
    assert len(saved) == 1 and saved[0]["vms"] == 2 and saved[0]["consistent"] is True
    assert len(cuts) == 1 and len(restored) == 1 and restored[0]["vms"] == 2
