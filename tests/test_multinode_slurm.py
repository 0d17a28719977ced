"""A two-node vjob on the real Slurm dev cluster with real QEMU (docs/multinode.md).

`sbatch -N2` of a plain script that says `#VJOB os=debian12`: job_submit.lua wraps it, the pilot
on the first node boots one VM per node on the job's private network, the script runs on the
first VM and reaches the second by its host name from $VJOB_NODEFILE over ssh (no password).
As the agent does, the test asks the pilot for a checkpoint (both VMs paused, then saved: one
cut), then Slurm requeues the job and starts it again (both restored, paused, then run
together). The second VM keeps its progress in /tmp,
a tmpfs (memory only): the right count at the end, with the same boot id, shows it was
restored and never rebooted.

Parametrized by `[agent] multinode_pilots`: "leader" (the default, in CI) drives both VMs from
the first node's pilot; "per-node" (a soak case: a second whole run, ~2–4 min, over CI's +40 s)
has that pilot start a member pilot on the second node with srun, which builds, boots, saves and
restores vm1 there at the leader's word.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.devcluster import DevCluster
from provisioning import image_build, network
from provisioning.driver import Driver
from provisioning.images import Catalogue
from tests.services import wait_for
from tests.test_realjob_slurm import _shim, wrapped_cluster  # noqa: F401 - the fixture
from vjob.config import ProvisioningConfig, load
from vjob.pilot_files import PilotDir, PilotState
from vjob.store.db import Store

pytestmark = [pytest.mark.slurm, pytest.mark.libvirt, pytest.mark.realvm, pytest.mark.slow]
STEPS = 8
SCRIPT = f"""#!/bin/bash
#SBATCH -N2
#VJOB os=debian12
set -e
me=$(hostname)
peers=$(awk '{{print $1}}' "$VJOB_NODEFILE" | grep -vx "$me")
for h in $peers; do echo "boot $h $(ssh "$h" cat /proc/sys/kernel/random/boot_id)"; done
for i in $(seq 1 {STEPS}); do
  for h in $peers; do ssh "$h" "echo $i >> /tmp/steps"; done
  echo "progress $i/{STEPS}"
  sleep 1
done
for h in $peers; do
  echo "$h $(ssh "$h" 'tr "\\n" " " < /tmp/steps; cat /proc/sys/kernel/random/boot_id')"
done > result.txt
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


def _forget_vms(site: Path, job: str) -> None:
    """The job's VMs and bridge, whatever state the run left them in (dev cluster job ids come
    round again when its state is wiped: a later run must not meet these)."""
    cfg = load(str(site / "vjob.toml"))
    with Driver(cfg.provisioning, data_dir=cfg.data_path) as driver:
        for rank in range(2):
            driver.delete(f"vjob-slurm-{job}-{rank}", "node1")
        network.remove_bridge(driver.connection("node1"), network.pilot_subnet_id("slurm", job))


def _job_state(cluster: DevCluster, job: str) -> str:
    text = subprocess.run(["scontrol", "show", "job", job], env={**os.environ, **cluster.env}, capture_output=True,
                          text=True, timeout=30).stdout  # fmt: skip
    m = re.search(r"JobState=(\S+)", text)
    return m.group(1) if m else ""


@pytest.mark.parametrize("mode", ["leader", pytest.param("per-node", marks=pytest.mark.soak)])
def test_two_node_job_reaches_its_peer_by_name_and_survives_a_requeue(
    wrapped_cluster: DevCluster,  # noqa: F811 - the fixture
    site: Path,
    mode: str,
) -> None:
    conf = site / "vjob.toml"
    conf.write_text(conf.read_text().replace("[agent]\n", f'[agent]\nmultinode_pilots = "{mode}"\n'))
    work = site / "work"
    work.mkdir()
    (work / "job.sh").write_text(SCRIPT)
    env = {**wrapped_cluster.env, "PATH": f"{_shim(site)}:/usr/bin:/bin", "VJOB_CONFIG": str(site / "vjob.toml")}
    res = subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in env.items()), "sbatch", "--parsable", "--requeue",
                          "job.sh"], cwd=work, capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    out = work / f"slurm-{job}.out"
    cenv = {**os.environ, **wrapped_cluster.env}
    try:
        wait_for(lambda: out.exists() and b"progress 3/" in out.read_bytes(), 900, "the script's 3rd progress line")
        # What the agent does (agent.act): ask the pilot for a checkpoint, wait for its answer, requeue.
        pdir = PilotDir(site / "pilots", "slurm", job)
        pdir.request_checkpoint("mn-test", "test")
        wait_for(lambda: (st := pdir.read_state()) is not None and st.state is PilotState.SAVED, 300, "the cut")
        saved = pdir.read_state()
        first_run = out.read_text(errors="replace")  # the RMS truncates the output at the requeue
        subprocess.run(["scontrol", "requeue", job], env=cenv, check=True, timeout=30, capture_output=True)
        wait_for(lambda: _job_state(wrapped_cluster, job) in ("COMPLETED", "FAILED", "CANCELLED"), 900, "the job's end")
        text = out.read_text(errors="replace")
        assert _job_state(wrapped_cluster, job) == "COMPLETED", text[-4000:]
    finally:
        subprocess.run(["scancel", job], env=cenv, timeout=30, check=False, capture_output=True)
        _forget_vms(site, job)
    assert "restoring VM vjob-slurm-" in text, text[-4000:]
    progress = [line.split()[1] for line in text.splitlines() if line.startswith("progress")]
    assert progress == [f"{i}/{STEPS}" for i in range(1, STEPS + 1)], text[-4000:]
    assert saved is not None and len(saved.member_nodes) == 2, saved
    cuts = [json.loads(line) for line in first_run.splitlines() if '"coordinated checkpoint"' in line]
    assert cuts and all(c["consistent"] for c in cuts), cuts
    # per-node: vm1 was set up, saved and restored by a member pilot on node2 (its own log lines)
    members = [json.loads(line) for line in text.splitlines() if '"member: set up"' in line]
    assert [m.get("node") for m in members] == (["node2"] if mode == "per-node" else []), text[-4000:]
    if mode == "per-node":
        assert '"member pilots joined"' in first_run and '"member: set up"' in first_run, first_run[-4000:]
    assert max(cuts[0]["paused_at"].values()) <= min(cuts[0]["save_started_at"].values())
    boot = re.search(r"^boot vm1 (\S+)$", text, re.M)
    assert boot is not None, text[-4000:]
    # vm1 counted every step in its tmpfs, with the boot id it had before the checkpoint
    assert (work / "result.txt").read_text().split() == ["vm1", *map(str, range(1, STEPS + 1)), boot.group(1)]
    restored = [json.loads(line) for line in text.splitlines() if '"multi-node job restored"' in line]
    print(json.dumps({"figure": "multinode_slurm", "mode": mode, "vms": 2,
                      "pause_to_saved_s": cuts[0]["pause_to_saved_s"],
                      "restore_to_running_s": restored[0]["restore_to_running_s"] if restored else None}))  # fmt: skip
