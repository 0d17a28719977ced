"""A multi-node vjob running an MPI ring on the real Slurm dev cluster with real QEMU (docs/multinode.md).

`sbatch -N2` of a plain script that says `#VJOB os=debian12` and runs
`mpirun --hostfile "$VJOB_NODEFILE" -np 2 python3 ring.py 12` (Open MPI and mpi4py are in the
default image; the ring is bench/multinode_mpi.py's: each round a counter goes once round the
ranks, +1 per hop, about one round a second). job_submit.lua wraps the script, the pilot on the
first node boots one VM per node on the job's private network, the script runs on the first VM and
mpirun starts the other ranks over ssh. After round 3, as the agent does, the test asks the pilot
for a checkpoint (every VM paused, then all saved: one cut, with the ring mid-run and Open MPI's
connections open), requeues the job held, excludes the nodes it ran on and releases it: Slurm
starts it on other nodes, whose pilot restores every VM there (paused, then all run together).
The ring must finish with the value of an uninterrupted run, each round printed once, exit 0.
Each rank also keeps its rounds in its VM's /tmp, a tmpfs (memory only): every round there at the
end, with the boot id printed before the checkpoint, shows every VM restored, never rebooted.

Parametrized by `[agent] multinode_pilots` and the node count: "leader" with 2 nodes (the default,
in CI) drives every VM from the first node's pilot; "per-node" (soak: a second whole run, over
CI's budget) has that pilot start a member pilot on every other node with srun, which builds,
boots, saves and restores that node's VM at the leader's word; 3 nodes (soak) is the leader mode
with a third VM in the ring and the cut.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.devcluster import DevCluster
from plugins.slurm import hostlist
from provisioning import image_build
from provisioning.driver import Driver
from provisioning.images import Catalogue
from tests import bench_scripts
from tests.services import wait_for
from tests.test_realjob_slurm import _shim, wrapped_cluster  # noqa: F401 - the fixture
from vjob.config import ProvisioningConfig, load
from vjob.pilot_files import PilotDir, PilotState
from vjob.store.db import Store

pytestmark = [pytest.mark.slurm, pytest.mark.libvirt, pytest.mark.realvm, pytest.mark.slow]
ROUNDS = 12
CHECKPOINT_AT = 3
"""The checkpoint is asked for after this round: the ring is then mid-run for ~9 more rounds."""
MPI = bench_scripts.load("multinode_mpi")


def _script(nodes: int) -> str:
    return f"""#!/bin/bash
#SBATCH -N{nodes}
#VJOB os=debian12
set -e
mpirun --allow-run-as-root --hostfile "$VJOB_NODEFILE" -np {nodes} python3 ring.py {ROUNDS}
"""


@pytest.fixture
def site(libvirt_system: str) -> Iterator[Path]:
    """A root vjob site: debian12 in its catalogue (cached build), its pilot directory."""
    site = Path(tempfile.mkdtemp(prefix="vjob-mnslurm-", dir="/var/tmp"))
    site.chmod(0o755)
    try:
        store = Store(f"sqlite:///{site / 'vjob.sqlite'}")
        store.upgrade()
        image_build.build(Catalogue(store, ProvisioningConfig(), data_dir=site / "data"), "debian12")
        store.close()
        (site / "pilots").mkdir(mode=0o700)
        (site / "vjob.toml").write_text(f'data_dir = "{site / "data"}"\n[agent]\npilot_dir = "{site / "pilots"}"\n')
        yield site
    finally:
        shutil.rmtree(site, ignore_errors=True)


def _forget_vms(site: Path, job: str, nodes: int) -> None:
    """The job's VMs and bridge, whatever state the run left them in (dev cluster job ids come
    round again when its state is wiped: a later run must not meet these). Every dev cluster
    node is this machine's libvirtd: node1's connection reaches them all."""
    cfg = load(str(site / "vjob.toml"))
    with Driver(cfg.provisioning, data_dir=cfg.data_path) as driver:
        MPI.forget_job(driver, job, ["node1"], nodes)


def _job(cluster: DevCluster, job: str) -> dict[str, str]:
    """`scontrol show job`'s fields (the few this test reads hold no spaces)."""
    text = subprocess.run(
        ["scontrol", "show", "job", job], env={**os.environ, **cluster.env}, capture_output=True, text=True, timeout=30
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def _printed(out: Path, pattern: bytes, cluster: DevCluster, job: str) -> bool:
    """Whether the job's output has `pattern` yet; fails at once, with the output, if the job ended."""
    if out.exists() and re.search(pattern, out.read_bytes(), re.M):
        return True
    state = _job(cluster, job).get("JobState", "")
    if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
        text = out.read_text(errors="replace") if out.exists() else "(no output)"
        pytest.fail(f"job {job} ended ({state}) before {pattern!r}:\n{text[-4000:]}")
    return False


def _scontrol(cluster: DevCluster, *args: str) -> None:
    subprocess.run(["scontrol", *args], env={**os.environ, **cluster.env}, check=True, timeout=30, capture_output=True)


def submit(cluster: DevCluster, site: Path, mode: str, files: dict[str, str]) -> tuple[str, Path]:
    """`sbatch --requeue job.sh` as a user would, in a working directory holding `files`, with the
    site's configuration in the pilots' mode; the job id and the working directory."""
    conf = site / "vjob.toml"
    conf.write_text(conf.read_text().replace("[agent]\n", f'[agent]\nmultinode_pilots = "{mode}"\n'))
    work = site / "work"
    work.mkdir()
    for name, text in files.items():
        (work / name).write_text(text)
    env = {**cluster.env, "PATH": f"{_shim(site)}:/usr/bin:/bin", "VJOB_CONFIG": str(conf)}
    res = subprocess.run(
        ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "sbatch", "--parsable", "--requeue", "job.sh"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0], work


def _requeue_elsewhere(cluster: DevCluster, job: str, exclude: list[str]) -> None:
    """What the agent does with a checkpointed job (plugins.slurm.adapter: requeuehold, then
    release and StartTime=now), with the nodes it ran on excluded while it is held, so Slurm
    starts it on others and its VMs' states must be moved there."""
    held_at = time.monotonic()
    _scontrol(cluster, "requeuehold", job)
    wait_for(lambda: _job(cluster, job).get("JobState") == "PENDING", 120, "the job held in the queue")
    _scontrol(cluster, "update", f"JobId={job}", f"ExcNodeList={','.join(exclude)}")
    _scontrol(cluster, "release", job)
    time.sleep(max(0.0, held_at + 3 - time.monotonic()))  # the adapter's start_now: not in the requeue's second
    _scontrol(cluster, "update", f"JobId={job}", "StartTime=now")


@pytest.mark.parametrize(
    ("mode", "nodes"),
    [
        ("leader", 2),
        pytest.param("per-node", 2, marks=pytest.mark.soak),
        pytest.param("leader", 3, marks=pytest.mark.soak),
    ],
)
def test_an_mpi_ring_is_checkpointed_mid_run_and_finishes_on_other_nodes(
    wrapped_cluster: DevCluster,  # noqa: F811 - the fixture
    site: Path,
    mode: str,
    nodes: int,
) -> None:
    t0 = time.monotonic()
    job, work = submit(wrapped_cluster, site, mode, {"job.sh": _script(nodes), "ring.py": MPI.RING})
    out = work / f"slurm-{job}.out"
    cenv = {**os.environ, **wrapped_cluster.env}
    try:
        wait_for(
            lambda: _printed(out, rb"^round %d " % CHECKPOINT_AT, wrapped_cluster, job),
            900,
            f"the ring's round {CHECKPOINT_AT}",
            interval=1.0,
        )
        # What the agent does (agent.act): ask the pilot for a checkpoint, wait for its answer, requeue.
        pdir = PilotDir(site / "pilots", "slurm", job)
        pdir.request_checkpoint("mn-test", "test")
        wait_for(lambda: (st := pdir.read_state()) is not None and st.state is PilotState.SAVED, 300, "the cut")
        saved = pdir.read_state()
        assert saved is not None and len(saved.member_nodes) == nodes, saved
        first_nodes = list(saved.member_nodes)
        first_run = out.read_text(errors="replace")  # the RMS truncates the output at the requeue
        _requeue_elsewhere(wrapped_cluster, job, first_nodes)
        wait_for(
            lambda: _job(wrapped_cluster, job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"),
            900,
            "the job's end",
        )
        text = out.read_text(errors="replace")
        fields = _job(wrapped_cluster, job)
        assert fields.get("JobState") == "COMPLETED", text[-4000:]
    finally:
        subprocess.run(["scancel", job], env=cenv, timeout=30, check=False, capture_output=True)
        _forget_vms(site, job, nodes)
    # The cut was mid-run: the first run printed round 3 at least and never the end.
    first_rounds = re.findall(r"^round (\d+) ", first_run, re.M)
    assert len(first_rounds) >= CHECKPOINT_AT and not re.search(r"^final ", first_run, re.M), first_run[-4000:]
    # ...and one cut: every VM paused before any save.
    cuts = [json.loads(line) for line in first_run.splitlines() if '"coordinated checkpoint"' in line]
    assert cuts and all(c["consistent"] for c in cuts), cuts
    assert len(cuts[0]["paused_at"]) == nodes, cuts[0]
    assert max(cuts[0]["paused_at"].values()) <= min(cuts[0]["save_started_at"].values()), cuts[0]
    # Resumed on other nodes: every VM restored there from its node's state.
    second_nodes = list(hostlist.expand(fields.get("NodeList", "")))
    assert len(second_nodes) == nodes and not set(second_nodes) & set(first_nodes), (first_nodes, second_nodes)
    restoring = f"restoring VM vjob-slurm-{job}-0 remotely (saved on {first_nodes[0]}) on {second_nodes[0]}"
    assert restoring in text, text[-4000:]
    # The ring's value is an uninterrupted run's, every round printed once.
    outcome = MPI.ring_outcome(text, ROUNDS, nodes)
    assert outcome["ok"] and outcome["final"] == nodes * ROUNDS, (outcome, text[-4000:])
    # Every rank's tmpfs holds every round, with the boot id it had before the checkpoint.
    memory = MPI.ring_memory(text, ROUNDS, nodes)
    assert memory["memory_kept"], text[-4000:]
    assert memory["boot_ids"] == dict(re.findall(r"^boot rank (\d+) (\S+)$", first_run, re.M)), first_run[-4000:]
    # per-node: the other VMs were set up, saved and restored by member pilots on their nodes.
    set_up = [
        [json.loads(line).get("node") for line in t.splitlines() if '"member: set up"' in line]
        for t in (first_run, text)
    ]
    if mode == "per-node":
        assert [sorted(s) for s in set_up] == [sorted(first_nodes[1:]), sorted(second_nodes[1:])], set_up
    else:
        assert set_up == [[], []], set_up
    restored = [json.loads(line) for line in text.splitlines() if '"multi-node job restored"' in line]
    print(
        json.dumps(
            {
                "figure": "multinode_slurm",
                "mode": mode,
                "vms": nodes,
                "pause_to_saved_s": cuts[0]["pause_to_saved_s"],
                "restore_to_running_s": restored[0]["restore_to_running_s"] if restored else None,
                "test_s": round(time.monotonic() - t0, 1),
                "load": os.getloadavg()[0],
            }
        )
    )
