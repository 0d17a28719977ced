"""An ordinary user's unchanged job checkpointed on one host and resumed on another that shares
nothing with it but the wire (issue 38 items 1 and 3; docs/multinode.md, "Two hosts").

The dev cluster runs on two network-namespace hosts (tests/services/two_hosts.py): host A serves
node1-4, host B node5-8, each with its own libvirtd, its own node-local directory for users' VMs
(`[provisioning] user_vm_dir`), its own sshd and its own /run. The user `vjrun` submits a plain
`sbatch job.sh` (no #VJOB line: the partition is the operator's vjob partition) excluded from
host B, so it starts on host A, in the user's own session libvirt there. After the first
progress line, `scontrol requeuehold` — Slurm's SIGTERM, the pilot saves its VM within KillWait
— then, while the job is held, ExcNodeList names host A's nodes and the job is released: Slurm
starts it on host B, whose pilot copies the VM's memory state, overlay and job disk from host A
over ssh as the user (rsync), checks each on arrival against the digests recorded at save time,
restores it and removes host A's copies.

Checked: the job ends as an uninterrupted run would (every progress line once, the chain's
result, `exit 3` recorded by Slurm, the files the user's); the guest's memory came across intact
(a 32 MiB random file in its /dev/shm has the same digest after the move, and the boot id is
the one printed before it: restored, never rebooted); the move was remote (host A -> host B)
and host A keeps none of the VM's files; its size in the guest is the allocation's. Measured: the
bytes moved, the pilot's restore time (copy, check, restore) and a plain rsync of the same files
over the same link as the same user, MB/s each.

Its checks are those of the one-host requeue test tests/test_realjob_slurm.py had (that test now
preempts the job through the agent, pause-first), on a 4-step chain instead of 12: Slurm's own
SIGTERM save of an ordinary user's job is run here, resumed on another host.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from devkit.devcluster import JOB_SUBMIT_LUA, DevCluster
from devkit.devcluster_hosts import Topology
from plugins.slurm.config import SlurmConfig
from plugins.slurm.images import read_image_list, write_image_list
from plugins.slurm.site_default import DEFAULTS_NAME, sync_partition_defaults
from tests.services import user_pilot, wait_for
from tests.services.two_hosts import two_host_cluster  # noqa: F401 - the fixture
from tests.test_realjob_slurm import SIZE_LINE, USER, _user
from vjob.config import ProvisioningConfig
from vjob.pilot_files import PilotDir, PilotState

pytestmark = [pytest.mark.slurm, pytest.mark.libvirt, pytest.mark.realvm, pytest.mark.slow]
MEM_LINE = 'echo "mem $(sha256sum < /dev/shm/blob | cut -c1-16) boot $(cat /proc/sys/kernel/random/boot_id)"\n'
"""The digest of a file that lives only in the guest's memory, and the guest's boot id."""
STEPS, ROUNDS = 4, 100_000
"""tests/test_realjob_realvm.py's hash chain, shorter: the move, not the work, is under test."""
SCRIPT = f"""#!/bin/bash
#SBATCH -N1 -c2 --mem=768M
{SIZE_LINE.strip()}
head -c 32M /dev/urandom > /dev/shm/blob
{MEM_LINE.strip()}
echo "start on $(hostname) as $(id -un) in $(pwd)"
python3 - <<'PY'
import hashlib
h = open("input.txt", "rb").read().strip()
for step in range(1, {STEPS + 1}):
    for _ in range({ROUNDS}):
        h = hashlib.sha256(h).digest()
    print(f"progress {{step}}/{STEPS} {{h.hex()[:12]}}", flush=True)
open("result.txt", "w").write(h.hex() + "\\n")
PY
{MEM_LINE.strip()}
exit 3
"""
"""The user's unchanged script: its size, a file in memory only, the chain, the file again, exit 3."""


def expected_chain(seed: bytes) -> str:
    h = seed
    for _ in range(STEPS * ROUNDS):
        h = hashlib.sha256(h).digest()
    return h.hex()


def _scontrol(cluster: DevCluster, *args: str) -> str:
    return subprocess.run(
        ["scontrol", *args], env={**os.environ, **cluster.env}, check=True, timeout=30, capture_output=True, text=True
    ).stdout


def _job(cluster: DevCluster, job: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", _scontrol(cluster, "show", "job", job)))


def _printed(cluster: DevCluster, job: str, out: Path, what: bytes) -> bool:
    """Whether the job's output has `what` yet; fails at once, with the output, if the job ended."""
    if out.exists() and what in out.read_bytes():
        return True
    state = _job(cluster, job).get("JobState", "")
    if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
        pytest.fail(f"job {job} ended ({state}): {out.read_text(errors='replace')[-3000:] if out.exists() else ''}")
    return False


def _vm_files(topology: Topology, host: str) -> list[Path]:
    """The user's VM files on `host`'s node-local disk (seen from the root namespace)."""
    base = topology.base / host / "local" / USER
    return sorted(p for sub in ("vms", "snapshots") for p in (base / sub).glob("vjob-*") if p.is_file())


def _plain_rsync(topology: Topology, files: list[Path]) -> tuple[float, float]:
    """Seconds a plain rsync (as the user, over ssh, host A -> host B) takes for `files`, and
    then a sha256sum of what arrived (the check the pilot makes on arrival)."""
    dest = topology.local_dir / USER / "rsync-bench"
    sources = " ".join(f"hosta:{topology.local_dir}/{USER}/{p.parent.name}/{p.name}" for p in files)
    as_user = [*topology.enter("hostb"), "runuser", "-u", USER, "--", "sh", "-c"]
    t0 = time.monotonic()
    subprocess.run([*as_user, f"mkdir -p {dest} && rsync -t --inplace {sources} {dest}/"], check=True, timeout=600)
    t1 = time.monotonic()
    subprocess.run([*as_user, f"sha256sum {dest}/* > /dev/null"], check=True, timeout=600)
    t2 = time.monotonic()
    subprocess.run([*topology.enter("hostb"), "rm", "-rf", str(dest)], check=True, timeout=60)
    return t1 - t0, t2 - t1


def test_a_user_job_saved_on_host_a_resumes_on_host_b_with_its_files_copied_and_checked(
    two_host_cluster: tuple[DevCluster, Topology],  # noqa: F811 - the fixture
) -> None:
    cluster, topology = two_host_cluster
    user = _user()
    topology.enrol(USER)
    host_a, host_b = topology.hosts()
    lua = cluster.etc / "job_submit.lua"
    if lua.read_text() != JOB_SUBMIT_LUA.read_text():
        shutil.copyfile(JOB_SUBMIT_LUA, lua)
    write_image_list(cluster.image_list, sorted({*read_image_list(cluster.image_list), "debian12"}))
    site = Path(tempfile.mkdtemp(prefix="vjob-2hosts-", dir="/var/tmp"))
    site.chmod(0o755)
    work = Path(user.pw_dir) / f"thtest-{os.getpid()}"
    job = ""
    try:
        bindir = user_pilot.prepare(site)
        hosts = ", ".join(f'{n} = "{h.name}"' for h in (host_a, host_b) for n in h.nodes)
        user_pilot.write_config(
            site,
            f'[provisioning]\nuser_vm_dir = "{topology.local_dir}/{{user}}"\ncopy_method = "rsync"\n'
            f"hosts = {{ {hosts} }}\n",
        )
        sync_partition_defaults(SlurmConfig(conf=str(cluster.conf), vjob_partitions={"main": "debian12"}))
        time.sleep(2.5)  # job_submit.lua's caches
        work.mkdir()
        (work / "job.sh").write_text(SCRIPT)
        (work / "input.txt").write_text("vjob-seed\n")
        for p in (work, work / "job.sh", work / "input.txt"):
            os.chown(p, user.pw_uid, user.pw_gid)
        env = {
            **cluster.env,
            "HOME": user.pw_dir,
            "PATH": f"{bindir}:/usr/bin:/bin",
            "VJOB_CONFIG": str(site / "vjob.toml"),
        }
        sbatch = ["sbatch", "--parsable", "--requeue", f"--exclude={','.join(host_b.nodes)}", "job.sh"]
        res = subprocess.run(
            ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *sbatch],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        job = res.stdout.strip().split(";")[0]
        out = work / f"slurm-{job}.out"
        wait_for(lambda: _printed(cluster, job, out, b"progress 1/"), 900, "the first progress line")
        first = _job(cluster, job)["NodeList"]
        assert first in host_a.nodes, first
        # Slurm's own checkpoint signal: SIGTERM, then SIGKILL after KillWait; held while it is moved
        pdir = PilotDir(site / "pilots", "slurm", job)
        _scontrol(cluster, "requeuehold", job)
        wait_for(lambda: _job(cluster, job).get("JobState") == "PENDING", 120, "the job held")
        saved = pdir.read_state()
        assert saved is not None and saved.state is PilotState.SAVED, saved
        files = _vm_files(topology, host_a.name)
        moved = sum(p.stat().st_size for p in files)
        assert {p.suffix for p in files} >= {".qcow2", ".state"}, files
        plain_s, hash_s = _plain_rsync(topology, files)
        _scontrol(cluster, "update", f"JobId={job}", f"ExcNodeList={','.join(host_a.nodes)}")
        _scontrol(cluster, "release", job)
        time.sleep(3)  # the adapter's start_now: not in the requeue's second
        _scontrol(cluster, "update", f"JobId={job}", "StartTime=now")
        wait_for(lambda: _job(cluster, job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"), 900, "the end")
        fields = _job(cluster, job)
        text = out.read_text(errors="replace")
        assert (fields.get("JobState"), fields.get("ExitCode")) == ("FAILED", "3:0"), text[-3000:]
        moved_line = re.search(r"restoring VM (\S+) remotely \(saved on (node\d+)\) on (node\d+)", text)
        assert moved_line, text[-3000:]
        assert moved_line.group(2) == first and moved_line.group(3) in host_b.nodes, moved_line.group(0)
        assert _vm_files(topology, host_a.name) == [], "host A kept the VM's files after the move"
        assert [line.split()[1] for line in text.splitlines() if line.startswith("progress")] == [
            f"{i}/{STEPS}" for i in range(1, STEPS + 1)
        ], text
        mem = re.findall(r"^mem ([0-9a-f]{16}) boot (\S+)$", text, re.M)
        assert len(mem) == 2 and mem[0] == mem[1], text[-3000:]  # the same memory, never rebooted
        assert f"as {USER} in {work}" in text
        size = re.search(r"^size (\d+) (\d+)$", text, re.M)
        assert size, text[-3000:]
        guest_mib, overhead = int(size.group(2)) / 1024, ProvisioningConfig().vm_overhead_mib
        assert int(size.group(1)) == 2 and 768 - overhead - 96 <= guest_mib <= 768 - overhead, size.group(0)
        assert (work / "result.txt").read_text() == expected_chain(b"vjob-seed") + "\n"
        assert (work / "result.txt").stat().st_uid == user.pw_uid and out.stat().st_uid == user.pw_uid
        restore_s = pdir.read_state().restore_seconds  # type: ignore[union-attr]
        copied = re.search(r'^\{.*"event": "saved vm copied and checked".*$', text, re.M)
        assert copied, text[-3000:]
        copy_s = float(json.loads(copied.group(0))["seconds"])
        figure = {
            "figure": "two_hosts_move",
            "bytes": moved,
            "files": [p.name.split(".", 1)[1] for p in files],
            "pilot_copy_checked_s": round(copy_s, 3),
            "pilot_copy_mb_s": round(moved / 1e6 / copy_s, 1),
            "pilot_restore_s": round(restore_s, 3),
            "plain_rsync_s": round(plain_s, 3),
            "plain_rsync_mb_s": round(moved / 1e6 / plain_s, 1),
            "plain_rsync_and_sha256_s": round(plain_s + hash_s, 3),
            "load": round(os.getloadavg()[0], 1),
        }
        print(json.dumps(figure))
    finally:
        if job:
            subprocess.run(["scancel", job], env={**os.environ, **cluster.env}, timeout=30, check=False)
        (cluster.etc / DEFAULTS_NAME).unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)
