"""An ordinary user's unchanged script on the site's filesystems through Slurm (issue 33, item 2).

A plain `sbatch job.sh` by an ordinary user (tests/test_realjob_slurm.USER) from a working
directory in the /home stand-in (declared in `[guest] mounts` with /scratch), the node service
running as root: the pilot asks `net.up` and `nfs.up` before it boots, the guest mounts /home
and /scratch from the job's gateway and runs in its working directory in place (nothing
staged), reading its input there and writing a line per round to /scratch. Slurm requeues the
job mid-run (the pilot saves the VM; the restarted pilot asks for the gateway again and restores
the guest): every round is on /scratch exactly once, the result is in the working directory,
every file the user's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devkit.devcluster import DevCluster
from provisioning import network
from provisioning.node_service import net_rules, network_ops, nfs_ops
from tests.services import user_pilot, wait_for
from tests.services.node_service import running
from tests.test_multinode_slurm import _as_user_python
from tests.test_realjob_slurm import USER, _user, wrapped_cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.realvm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
ROUNDS = 30
JOB = f"""#!/bin/bash
#SBATCH -N1 -c1 --mem=768M
#VJOB os=debian12
echo "in $(pwd) as $(id -un)"
cat input.txt
for i in $(seq 1 {ROUNDS}); do echo "round $i" >> /scratch/{USER}/rounds.txt; echo "progress $i"; sleep 1; done
echo finished > result.txt
"""


@pytest.fixture
def site(wrapped_cluster: DevCluster) -> Iterator[tuple[Path, Path]]:  # noqa: F811
    """The /home and /scratch stand-ins, a node service serving them; yields (base, socket)."""
    base = Path(tempfile.mkdtemp(prefix="vjob-n3site-", dir="/var/tmp"))
    base.chmod(0o755)
    user = _user()
    for d, mode in ((base / "home", 0o755), (base / "scratch", 0o755)):
        d.mkdir(mode=mode)
        d.chmod(mode)
    for d, mode in ((base / "home" / USER, 0o755), (base / "scratch" / USER, 0o700)):
        d.mkdir()
        os.chown(d, user.pw_uid, user.pw_gid)
        d.chmod(mode)
    home, scratch = (
        f'{{source = "{base / "home"}", target = "/home"}}',
        f'{{source = "{base / "scratch"}", target = "/scratch"}}',
    )
    mounts = f"mounts = [{home}, {scratch}]"
    try:
        with running(wrapped_cluster, f'network = "none"\n{mounts}', "vjob-n3svc-") as service:
            (base / "mounts.toml").write_text(f'[guest]\nnetwork = "none"\n{mounts}\n')
            yield base, service.socket
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_users_job_works_in_place_on_the_site_filesystems_across_a_requeue(
    wrapped_cluster: DevCluster,  # noqa: F811
    site: tuple[Path, Path],
) -> None:
    base, sock = site
    user = _user()
    top = Path(tempfile.mkdtemp(prefix="vjob-n3pilot-", dir="/var/tmp"))
    top.chmod(0o755)
    work = base / "home" / USER / "run"
    job = ""
    try:
        bindir = user_pilot.prepare(top)
        mounts = (base / "mounts.toml").read_text().split("\n", 1)[1]
        user_pilot.write_config(top, f'[node]\nsocket = "{sock}"\n[guest]\n{mounts}')
        work.mkdir()
        (work / "job.sh").write_text(JOB)
        (work / "input.txt").write_text("seed-from-home\n")
        for p in (work, work / "job.sh", work / "input.txt"):
            os.chown(p, user.pw_uid, user.pw_gid)
        env = {
            **wrapped_cluster.env,
            "HOME": user.pw_dir,
            "PATH": f"{bindir}:/usr/bin:/bin",
            "VJOB_CONFIG": str(top / "vjob.toml"),
        }
        argv = ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
        res = subprocess.run(
            [*argv, "sbatch", "--parsable", "--requeue", "job.sh"], cwd=work, capture_output=True, text=True, timeout=30
        )
        assert res.returncode == 0, res.stderr
        job = res.stdout.strip().split(";")[0]
        out, rounds = work / f"slurm-{job}.out", base / "scratch" / USER / "rounds.txt"
        cenv = {**os.environ, **wrapped_cluster.env}

        def state() -> str:
            text = subprocess.run(
                ["scontrol", "show", "job", job], env=cenv, capture_output=True, text=True, timeout=30
            ).stdout
            m = re.search(r"JobState=(\S+)", text)
            return m.group(1) if m else ""

        def waited(predicate: Callable[[], bool], timeout: float, what: str) -> None:
            try:
                wait_for(predicate, timeout, what)
            except TimeoutError as exc:  # the job's own words say why
                text = out.read_text(errors="replace")[-3000:] if out.exists() else "(no job output)"
                raise AssertionError(f"{exc}; job {job} ({state()}):\n{text}") from None

        t0 = time.monotonic()
        waited(lambda: rounds.exists() and len(rounds.read_text().splitlines()) >= 5, 300, "5 rounds on /scratch")
        first_s = time.monotonic() - t0
        subprocess.run(["scontrol", "requeue", job], env=cenv, check=True, timeout=30, capture_output=True)
        waited(lambda: state() in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 600, f"job {job} to end")
        took = time.monotonic() - t0
        text = out.read_text(errors="replace")
        assert state() == "COMPLETED", text[-3000:]
        assert "restoring VM" in text, text[-3000:]
        assert f"in /home/{USER}/run as {USER}" in text and "seed-from-home" in text, text[-3000:]
        assert [line for line in rounds.read_text().splitlines()] == [f"round {i}" for i in range(1, ROUNDS + 1)]
        assert (work / "result.txt").read_text() == "finished\n"
        for f in (work / "result.txt", rounds):
            assert (f.stat().st_uid, f.stat().st_gid) == (user.pw_uid, user.pw_gid)
        gateway_dir = Path("/run/vjob/nfs") / network.bridge_name(network.pilot_subnet_id("slurm", job))
        wait_for(lambda: not gateway_dir.exists(), 30, "the job's gateway stopped after the job")
        print(f"submission -> 5 rounds {first_s:.1f} s; -> end across a requeue {took:.1f} s")
    finally:
        if job:
            subprocess.run(["scancel", job], env={**os.environ, **wrapped_cluster.env}, timeout=30, check=False)
            _forget(top, job)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)


FORGET_ONE = """
import sys
from pilot.specs import user_provisioning
from provisioning.driver import Driver
from vjob.config import load
cfg = load(sys.argv[1])
with Driver(user_provisioning(cfg.provisioning), data_dir=cfg.data_path) as driver:
    driver.delete(f"vjob-slurm-{sys.argv[2]}", "node1")
"""


def _forget(top: Path, job: str) -> None:
    """The job's VM (the user's session libvirt), NFS gateway and network, whatever a failed run
    left: the dev cluster's job ids come round again when its state is wiped, and a later run of
    the same id must not meet them."""
    _as_user_python(FORGET_ONE, str(top / "vjob.toml"), job)
    nfs_ops.stop_unrecorded(nfs_ops.job_dir(network.pilot_subnet_id("slurm", job)))
    network_ops.teardown(net_rules.job_net("slurm", job))
