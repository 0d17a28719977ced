"""An ordinary user's MPI ring with its two VMs on two hosts that share nothing but the wire, cut
by Slurm's SIGTERM alone and resumed with the hosts swapped (issue 38; docs/multinode.md, "Two
hosts").

The dev cluster runs on two network-namespace hosts (tests/services/two_hosts.py), their nodes
interleaved: host A serves node1,3,5,7, host B node2,4,6,8, each with its own libvirtd, its own
node-local directory for users' VMs (`[provisioning] user_vm_dir`), its own sshd, /run and node
service, which joins a job's bridge to the other host's by VXLAN (`[node] tunnel_networks`). The
user `vjrun` submits a plain `sbatch -N2 -c2 --mem=768M job.sh` (no #VJOB line: the operator's
vjob partition gives the image) excluded from node3-8: rank 0's VM runs on node1 (host A) in the
user's session libvirt there, rank 1's on node2 (host B) under a member pilot (srun), each on its
tap from its own host's node service; the ranks talk over the job's tunnel. After round 3 of the
ring, `scontrol requeuehold` — Slurm's SIGTERM to every step, SIGKILL after KillWait, no request
from any agent: the leader pauses both VMs, then saves both (one cut). Held, the job's
ExcNodeList becomes node1-3 and node6-8 and it is released: Slurm starts it on node4 (host B) and
node5 (host A), so VM 0 goes from host A to host B and VM 1 from host B to host A, each pilot
copying its VM's state, overlay, job disk and logs from the other host over ssh as the user,
checked on arrival against the digests recorded at save time, then both restored paused and run.

Checked: the ring ends with an uninterrupted run's value, every round printed once; each rank's
tmpfs holds every round with the boot id it had before the cut, and a 32 MiB random file in VM
0's /dev/shm has the same digest after the move (restored, never rebooted); every guest has 2
vCPUs and 768 MiB less the overhead; the job's VXLAN was up on both hosts while it ran; the
script's `exit 3` is Slurm's; the files are the user's; neither host keeps a file or a domain
definition of the VMs at the end. Measured: the bytes moved, the cut (SIGTERM to all saved), the
pilots' copy-and-check per VM, the restore, and a plain rsync of host A's files over the same
link as the same user.

This one job replaces the single-VM job saved on host A and resumed on host B that this file held
(its checks folded in) and is CI's SIGTERM-only cut of a user's per-node job, across hosts
(root's per-node variant of it is the soak case of tests/test_multinode_slurm.py). Whether a second job's VMs see
this one's frames is tests/test_job_tunnel_netns.py's (the same node service's net.up on
namespace hosts).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

from devkit.devcluster import JOB_SUBMIT_LUA, DevCluster
from devkit.devcluster_hosts import Topology
from plugins.slurm import hostlist
from plugins.slurm.config import SlurmConfig
from plugins.slurm.images import read_image_list, write_image_list
from plugins.slurm.site_default import DEFAULTS_NAME, sync_partition_defaults
from provisioning.node_service import net_rules, tunnel
from tests.services import user_pilot, wait_for
from tests.services.two_hosts import two_host_cluster  # noqa: F401 - the fixture
from tests.test_multinode_slurm import MPI, SIZE_RE, SIZE_SH
from tests.test_realjob_slurm import USER, _user
from vjob.config import ProvisioningConfig
from vjob.pilot_files import PilotDir, PilotState

pytestmark = [pytest.mark.slurm, pytest.mark.libvirt, pytest.mark.realvm, pytest.mark.slow]
ROUNDS, CUT_AFTER = 12, 3
MEM_LINE = 'echo "mem $(sha256sum < /dev/shm/blob | cut -c1-16) boot $(cat /proc/sys/kernel/random/boot_id)"'
"""The digest of a file that lives only in VM 0's memory, and its boot id."""
SCRIPT = f"""#!/bin/bash
#SBATCH -N2 -c2 --mem=768M
set -eo pipefail
echo "in $(pwd) as $(id -un)"
for h in $(cut -d' ' -f1 "$VJOB_NODEFILE"); do ssh "$h" sh < size.sh; done
head -c 32M /dev/urandom > /dev/shm/blob
{MEM_LINE}
mpirun --hostfile "$VJOB_NODEFILE" -np 2 python3 ring.py {ROUNDS}
{MEM_LINE}
exit 3
"""
"""The user's unchanged script: each VM's size over ssh, a file in memory only, the ring, the file again, exit 3."""
FIRST_EXCLUDE = ["node3", "node4", "node5", "node6", "node7", "node8"]
"""Only node1 (host A) and node2 (host B) are left: rank 0 on host A."""
SECOND_EXCLUDE = ["node1", "node2", "node3", "node6", "node7", "node8"]
"""Only node4 (host B) and node5 (host A) are left: rank 0 on host B, the hosts swapped."""


def _scontrol(cluster: DevCluster, *args: str) -> str:
    return subprocess.run(
        ["scontrol", *args], env={**os.environ, **cluster.env}, check=True, timeout=30, capture_output=True, text=True
    ).stdout


def _job(cluster: DevCluster, job: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", _scontrol(cluster, "show", "job", job)))


def _printed(cluster: DevCluster, job: str, out: Path, pattern: bytes) -> bool:
    """Whether the job's output has `pattern` yet; fails at once, with the output, if the job ended."""
    if out.exists() and re.search(pattern, out.read_bytes(), re.M):
        return True
    state = _job(cluster, job).get("JobState", "")
    if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
        pytest.fail(f"job {job} ended ({state}): {out.read_text(errors='replace')[-4000:] if out.exists() else ''}")
    return False


def _vm_files(topology: Topology, host: str, job: str) -> list[Path]:
    """The files of the job's VMs on `host`'s node-local disk (seen from the root namespace)."""
    base = topology.base / host / "local" / USER
    mine = f"vjob-slurm-{job}-*"
    return sorted(p for sub in ("vms", "snapshots") for p in (base / sub).glob(mine) if p.is_file())


def _definitions(topology: Topology, host: str) -> list[Path]:
    """Domain definitions of the user's session libvirt on `host` (pilot.specs.node_local_session)."""
    return sorted((topology.base / host / "local" / USER / "s" / "c" / "libvirt" / "qemu").glob("vjob-*.xml"))


def _vxlan(topology: Topology, host: str, job: str) -> str:
    """`bridge fdb show` of the job's VXLAN device on `host` (its flood entries name the other
    hosts' addresses: `dst ADDR`); "" when the host has no such device."""
    dev = tunnel.device(net_rules.job_net("slurm", job))
    done = subprocess.run(
        [*topology.enter(host), "bridge", "fdb", "show", "dev", dev],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout if done.returncode == 0 else ""


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


def _site(cluster: DevCluster, topology: Topology, site: Path) -> Path:
    """The site's vjob.toml for the user's pilots (node-local VMs copied by rsync between the
    hosts, every host's node service on the same socket path), debian12 the partition's image;
    the shim's directory."""
    lua = cluster.etc / "job_submit.lua"
    if lua.read_text() != JOB_SUBMIT_LUA.read_text():
        shutil.copyfile(JOB_SUBMIT_LUA, lua)
    write_image_list(cluster.image_list, sorted({*read_image_list(cluster.image_list), "debian12"}))
    bindir = user_pilot.prepare(site)
    hosts = ", ".join(f'{n} = "{h.name}"' for h in topology.hosts() for n in h.nodes)
    user_pilot.write_config(
        site,
        f'[provisioning]\nuser_vm_dir = "{topology.local_dir}/{{user}}"\ncopy_method = "rsync"\n'
        f'hosts = {{ {hosts} }}\n[node]\nsocket = "/run/vjob/node.sock"\n',
    )
    sync_partition_defaults(SlurmConfig(conf=str(cluster.conf), vjob_partitions={"main": "debian12"}))
    time.sleep(2.5)  # job_submit.lua's caches
    return bindir


def _submit(cluster: DevCluster, site: Path, bindir: Path, work: Path) -> str:
    user = _user()
    work.mkdir()
    files = {"job.sh": SCRIPT, "ring.py": MPI.RING, "size.sh": SIZE_SH}
    for name, text in files.items():
        (work / name).write_text(text)
    for p in (work, *(work / name for name in files)):
        os.chown(p, user.pw_uid, user.pw_gid)
    env = {
        **cluster.env,
        "HOME": user.pw_dir,
        "PATH": f"{bindir}:/usr/bin:/bin",
        "VJOB_CONFIG": str(site / "vjob.toml"),
    }
    sbatch = ["sbatch", "--parsable", "--requeue", f"--exclude={','.join(FIRST_EXCLUDE)}", "job.sh"]
    res = subprocess.run(
        ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *sbatch],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def test_an_mpi_ring_on_two_hosts_cut_by_sigterm_resumes_with_the_hosts_swapped(
    two_host_cluster: tuple[DevCluster, Topology],  # noqa: F811 - the fixture
) -> None:
    cluster, topology = two_host_cluster
    user = _user()
    topology.enrol(USER)
    host_a, host_b = topology.hosts()
    assert {"node1", "node5"} <= set(host_a.nodes) and {"node2", "node4"} <= set(host_b.nodes), topology.hosts()
    site = Path(tempfile.mkdtemp(prefix="vjob-2hosts-", dir="/var/tmp"))
    site.chmod(0o755)
    work = Path(user.pw_dir) / f"thtest-{os.getpid()}"
    job = ""
    try:
        bindir = _site(cluster, topology, site)
        t0 = time.monotonic()
        job = _submit(cluster, site, bindir, work)
        out = work / f"slurm-{job}.out"
        wait_for(lambda: _printed(cluster, job, out, rb"^round %d " % CUT_AFTER), 1200, "the ring's third round")
        first_nodes = list(hostlist.expand(_job(cluster, job)["NodeList"]))
        assert first_nodes == ["node1", "node2"], first_nodes
        tunnels = {h.name: _vxlan(topology, h.name, job) for h in (host_a, host_b)}
        assert f"dst {host_b.address}" in tunnels["hosta"] and f"dst {host_a.address}" in tunnels["hostb"], tunnels
        # Slurm's own checkpoint signal, no agent: SIGTERM to both steps, SIGKILL after KillWait
        pdir = PilotDir(site / "pilots", "slurm", job)
        sent = time.time()
        _scontrol(cluster, "requeuehold", job)
        first_run = ""

        def first_ended() -> bool:
            nonlocal first_run
            text = out.read_text(errors="replace") if out.exists() else ""
            if "SIGTERM: exiting" in text:
                first_run = text
            return bool(first_run) and _job(cluster, job).get("JobState") == "PENDING"

        wait_for(first_ended, 180, "the pilot's save on SIGTERM and the job held")
        cut_at = time.monotonic()
        saved = pdir.read_state()
        assert saved is not None and saved.state is PilotState.SAVED, (saved, first_run[-4000:])
        assert list(saved.member_nodes) == first_nodes, saved
        # the agent's view, read where the agent runs (here, host A's directory unseen): the record
        assert saved.memory_saved and not saved.memory_on_this_host and saved.save_bytes > 0, saved
        files = {h.name: _vm_files(topology, h.name, job) for h in (host_a, host_b)}
        per_host = {h: sum(p.stat().st_size for p in fs) for h, fs in files.items()}
        assert all({p.suffix for p in fs} >= {".qcow2", ".state"} for fs in files.values()), files
        plain_s, hash_s = _plain_rsync(topology, files["hosta"])
        _scontrol(cluster, "update", f"JobId={job}", f"ExcNodeList={','.join(SECOND_EXCLUDE)}")
        _scontrol(cluster, "release", job)
        time.sleep(3)  # the adapter's start_now: not in the requeue's second
        _scontrol(cluster, "update", f"JobId={job}", "StartTime=now")
        wait_for(lambda: _job(cluster, job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"), 1200, "the end")
        end_at = time.monotonic()
        fields = _job(cluster, job)
        text = out.read_text(errors="replace")
        assert (fields.get("JobState"), fields.get("ExitCode")) == ("FAILED", "3:0"), text[-4000:]
        second_nodes = list(hostlist.expand(fields.get("NodeList", "")))
        assert second_nodes == ["node4", "node5"], second_nodes  # VM 0 on host B, VM 1 on host A
        _check_ring(job, first_run, text)
        copies = _check_moves(job, text)
        # the VM that ended on a host leaves its console log there (the driver's mark of a VM
        # stopped, on one host as on two); the other host keeps nothing of the VM that left it
        ended = {"hosta": [f"vjob-slurm-{job}-1.console.log"], "hostb": [f"vjob-slurm-{job}-0.console.log"]}
        for h in (host_a, host_b):
            assert [p.name for p in _vm_files(topology, h.name, job)] == ended[h.name], f"{h.name} kept the VMs' files"
            assert _definitions(topology, h.name) == [], f"{h.name}'s session libvirt kept a definition"
            assert _vxlan(topology, h.name, job) == "", f"{h.name} kept the job's tunnel"
        _check_sizes(first_run)
        assert f"in {work} as {USER}" in text, text[-4000:]
        assert out.stat().st_uid == user.pw_uid, out.stat()
        restored = pdir.read_state()
        assert restored is not None
        steps = {"submit_to_held_s": round(cut_at - t0, 1), "held_to_end_s": round(end_at - cut_at, 1)}
        _figure(first_run, text, sent, per_host, copies, restored.restore_seconds, (plain_s, hash_s), steps)
    finally:
        if job:
            subprocess.run(["scancel", job], env={**os.environ, **cluster.env}, timeout=30, check=False)
        (cluster.etc / DEFAULTS_NAME).unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)


def _check_ring(job: str, first_run: str, text: str) -> None:
    """One cut mid-ring (both VMs paused before any save), the ring's uninterrupted value with
    every round once, every rank's memory and VM 0's /dev/shm file kept, member pilots on node2
    then node5."""
    assert re.search(rb"^round %d " % CUT_AFTER, first_run.encode(), re.M) and "\nfinal " not in first_run
    cuts = [json.loads(line) for line in first_run.splitlines() if '"coordinated checkpoint"' in line]
    assert len(cuts) == 1 and cuts[0]["consistent"] and len(cuts[0]["paused_at"]) == 2, first_run[-4000:]
    assert max(cuts[0]["paused_at"].values()) <= min(cuts[0]["save_started_at"].values()), cuts[0]
    outcome = MPI.ring_outcome(text, ROUNDS, 2)
    assert outcome["ok"] and outcome["final"] == 2 * ROUNDS, (outcome, text[-4000:])
    memory = MPI.ring_memory(text, ROUNDS, 2)
    assert memory["memory_kept"], text[-4000:]
    assert memory["boot_ids"] == dict(re.findall(r"^boot rank (\d+) (\S+)$", first_run, re.M)), first_run[-4000:]
    mem = re.findall(r"^mem ([0-9a-f]{16}) boot (\S+)$", text, re.M)
    assert len(mem) == 2 and mem[0] == mem[1] and mem[0][1] == memory["boot_ids"]["0"], text[-4000:]
    members = [
        [json.loads(line).get("node") for line in t.splitlines() if '"member: set up"' in line]
        for t in (first_run, text)
    ]
    assert members == [["node2"], ["node5"]], members
    assert f"restoring VM vjob-slurm-{job}-0 remotely (saved on node1) on node4" in text, text[-4000:]
    assert "booting VM" not in text.split("SIGTERM: exiting")[-1], text[-4000:]


def _check_moves(job: str, text: str) -> dict[str, float]:
    """Each VM's state, overlay and job disk copied from the other host and checked on arrival
    (provisioning.saved_move): VM 0 node1 -> node4, VM 1 node2 -> node5; the seconds of each."""
    copied = [json.loads(line) for line in text.splitlines() if '"saved vm copied and checked"' in line]
    pairs = {c["vm"]: (c["source"], c["node"]) for c in copied}
    assert pairs == {f"vjob-slurm-{job}-0": ("node1", "node4"), f"vjob-slurm-{job}-1": ("node2", "node5")}, copied
    return {c["vm"].rsplit("-", 1)[1]: float(c["seconds"]) for c in copied}


def _check_sizes(first_run: str) -> None:
    """Both guests ran the user's commands as the user, with 2 vCPUs and 768 MiB less the VM's
    overhead (the kernel's own reservations within 96 MiB); the job's key is not in the home."""
    sizes = SIZE_RE.findall(first_run)
    assert sorted(s[0] for s in sizes) == ["vm0", "vm1"], first_run[-4000:]
    overhead = ProvisioningConfig().vm_overhead_mib
    for _vm, uid, cpus, kib, homekey in sizes:
        assert int(uid) == _user().pw_uid and int(cpus) == 2 and homekey == "no", sizes
        assert 768 - overhead - 96 <= int(kib) / 1024 <= 768 - overhead, sizes


def _figure(
    first_run: str,
    text: str,
    sent: float,
    per_host: dict[str, int],
    copies: dict[str, float],
    restore_s: float,
    plain: tuple[float, float],
    steps: dict[str, float],
) -> None:
    """The bytes moved and the time of each step (the SIGTERM's cut timed from the requeuehold,
    wall clock: the pilot logs `time.time()`); a plain rsync of host A's files for the ratio."""
    cut = next(json.loads(line) for line in first_run.splitlines() if '"coordinated checkpoint"' in line)
    all_saved = datetime.fromisoformat(cut["timestamp"].replace("Z", "+00:00")).timestamp()
    restored = [json.loads(line) for line in text.splitlines() if '"multi-node job restored"' in line]
    print(
        json.dumps(
            {
                "figure": "two_hosts_ring",
                "bytes": sum(per_host.values()),
                "bytes_per_host": per_host,
                "sigterm_to_first_pause_s": round(min(cut["paused_at"].values()) - sent, 3),
                "pause_to_saved_s": cut["pause_to_saved_s"],
                "sigterm_to_all_saved_s": round(all_saved - sent, 3),
                "copy_checked_s": copies,
                "restore_to_running_s": restored[0]["restore_to_running_s"] if restored else None,
                "pilot_restore_s": round(restore_s, 3),
                "plain_rsync_host_a_s": round(plain[0], 3),
                "plain_rsync_host_a_mb_s": round(per_host["hosta"] / 1e6 / plain[0], 1),
                "plain_rsync_and_sha256_s": round(sum(plain), 3),
                **steps,
                "load": round(os.getloadavg()[0], 1),
            }
        )
    )
    # VM 0's move alone (host A's files, the plain rsync's), for bench/two_hosts_move.py's ratio;
    # VM 1's copy the other way runs at the same time
    move = {"bytes": per_host["hosta"], "pilot_copy_checked_s": copies["0"], "plain_rsync_s": round(plain[0], 3)}
    print(json.dumps({"figure": "two_hosts_move", **move, "plain_rsync_and_sha256_s": round(sum(plain), 3)}))
