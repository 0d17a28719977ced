"""A multi-node vjob running an MPI ring on the real Slurm dev cluster with real QEMU (docs/multinode.md).

The CI case is issue 33's combined scenario, an ordinary user's real job using the whole site
with one boot of two VMs: the user `vjrun` (tests/test_realjob_slurm) submits `sbatch -N2 -c2
--mem=768M` of a plain script that says `#VJOB os=debian12` (USER_JOB) from a working directory
in the /home stand-in that the node service exports over the job's NFS gateway
(tests/services/user_site.py: `[guest] mounts` /home and /scratch, `network = "nat"`, `dns` the
site namespace's name server). The job runs there in place (nothing staged): it reads the ring's
length from input.txt, prints each guest's size over ssh, fetches the licence token by name
(licence.site.test through the site's DNS and the node's NAT), runs `mpirun --hostfile
"$VJOB_NODEFILE" -np 2 python3 ring.py N` — no `--allow-run-as-root`: the job runs as the user
in every guest — copying each round rank 0 prints to /scratch/vjrun/rounds.txt, fetches the token
again and writes result.txt. Open MPI and mpi4py are in the default image; the ring is
bench/multinode_mpi.py's (each round a counter goes once round the ranks, +1 per hop, about one
round a second). job_submit.lua wraps the script; the user's pilot on the first node starts a
member pilot on the other node (srun: a user's job always runs per-node pilots,
pilot.members.launch.pilots_mode), each pilot asks its node's node service for its VM's tap on
the job's network and the NFS gateway, and runs its VM on the user's own libvirt,
qemu:///session. mpirun starts the other rank over ssh with the job's key, which the guests keep
in their own /etc (provisioning.guest_agent.ssh), never in the user's home. After round 3, as the
agent does, the test asks the pilot for a checkpoint (every VM paused, then all saved: one cut,
with the ring mid-run, Open MPI's connections and the NFS mounts open), requeues the job held,
excludes the nodes it ran on and releases it: Slurm starts it on other nodes, whose pilots ask
for the network and the gateway there and restore every VM (paused, then all run together).

At the end: the ring has the value of an uninterrupted run, each round printed once; every round
is in /scratch exactly once and in order; the licence was fetched once before the cut and once
after it, the server seeing the node's address; the files are the user's; exit 0. Each rank also
keeps its rounds in its VM's /tmp, a tmpfs (memory only): every round there at the end, with the
boot id printed before the checkpoint, shows every VM restored, never rebooted. In each guest
`nproc` is 2 and MemTotal 768 MiB less the VM's overhead. `sacct -j JOB -o
JobID,State,ExitCode,TotalCPU,AdminComment -P` (slurmdbd) shows COMPLETED, 0:0, the job's CPU
time, and the VMs' CPU seconds that the node service wrote into AdminComment.

On the dev cluster every node is this one machine: every node's session libvirt is the user's one
session libvirtd, and every node's node service is the one the fixture starts.

The second CI case is root's leader-mode pilot (the first node's pilot drives every VM through
root's libvirt, the bridge made by that libvirt; `mpirun --allow-run-as-root`, staged, no site)
cut by Slurm's SIGTERM alone: after round 3, `scontrol requeuehold` and nothing else, as when
Slurm requeues or preempts (GraceTime) a job the agent did not ask about. Slurm sends SIGTERM to
the batch step and SIGKILL KillWait (5 s here) later; the pilot must pause both VMs, save both
(one cut) and exit on its own before that. Then the same move as above: held, the nodes it ran
on excluded, released, every VM restored on the other nodes. Its figures time the cut from the
requeuehold. (The per-node SIGTERM-only cut of a user's job runs in CI across two hosts,
tests/test_two_hosts_slurm.py; the agent's request to a leader-mode pilot in
tests/test_agent_e2e_slurm.py, counter guests.)

Soak (`-m soak`), variants of the CI cases: root's per-node pilots cut by SIGTERM alone (the
members ignore their step's SIGTERM and save at their leader's word), and root's leader mode with
3 nodes cut by the agent's request (3 VMs in the ring and the cut).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from devkit.devcluster import DevCluster
from plugins.slurm import hostlist
from provisioning import network
from provisioning.driver import Driver
from provisioning.node_service import net_rules, network_ops, nfs_ops
from tests import bench_scripts
from tests import multinode_site_checks as checks
from tests.services import user_pilot, wait_for
from tests.services.user_site import UserSite, user_site
from tests.test_realjob_slurm import REPO, USER, _user, wrapped_cluster  # noqa: F401 - the fixture
from vjob.config import ProvisioningConfig, load
from vjob.pilot_files import PilotDir, PilotState

pytestmark = [pytest.mark.slurm, pytest.mark.libvirt, pytest.mark.realvm, pytest.mark.slow]
ROUNDS = 12
CHECKPOINT_AT = 3
"""The checkpoint is asked for after this round: the ring is then mid-run for ~9 more rounds."""
MPI = bench_scripts.load("multinode_mpi")
SIZE_SH = """\
echo "size $(hostname) uid $(id -u) cpus $(nproc) kib $(awk '/^MemTotal/ {print $2}' /proc/meminfo) \
homekey $(grep -qsF "$(cat /etc/vjob/ssh/$(id -u).pub)" "$HOME/.ssh/authorized_keys" && echo yes || echo no)"
"""
"""Run on every VM over ssh by the user's script: who runs, the guest's vCPUs and MemTotal, and
whether the job's key is in the home's authorized_keys (it must not be)."""
SIZE_RE = re.compile(r"^size (vm\d+) uid (\d+) cpus (\d+) kib (\d+) homekey (yes|no)$", re.M)
USER_JOB = """#!/bin/bash
#SBATCH -N@NODES@ -c2 --mem=768M
#VJOB os=debian12
set -eo pipefail
echo "in $(pwd) as $(id -un)"
rounds=$(cat input.txt)
for h in $(cut -d' ' -f1 "$VJOB_NODEFILE"); do ssh "$h" sh "$PWD/size.sh"; done
python3 licence.py before "$(cat node_port.txt)"
mpirun --hostfile "$VJOB_NODEFILE" -np @NODES@ python3 ring.py "$rounds" | while IFS= read -r line; do
  echo "$line"
  case "$line" in "round "*) echo "$line" >> "/scratch/$(id -un)/rounds.txt" ;; esac
done
python3 licence.py after "$(cat node_port.txt)"
echo "rounds $(wc -l < "/scratch/$(id -un)/rounds.txt")" > result.txt
"""
"""The user's script (the combined scenario of issue 33's "Tests"): it runs in place in its
working directory on the /home stand-in, reads the ring's length from input.txt there, fetches
the licence token by name before the ring and after it (the checkpoint falls in between), and
copies each ring round rank 0 prints into /scratch."""


@dataclass(frozen=True)
class Case:
    """Who submits, the pilots' mode, the node count, and what cuts the job: "request" (the
    agent's: a checkpoint request, SAVED, then `scontrol requeuehold`) or "sigterm" (Slurm's
    alone: `scontrol requeuehold` with no request, as a requeue or a preemption with GraceTime
    that the agent did not ask for: SIGTERM to every step, SIGKILL KillWait later)."""

    user: bool
    mode: str
    nodes: int
    cut: str = "request"

    def script(self) -> str:
        if self.user:
            return USER_JOB.replace("@NODES@", str(self.nodes))
        return f"""#!/bin/bash
#SBATCH -N{self.nodes}
#VJOB os=debian12
set -e
mpirun --allow-run-as-root --hostfile "$VJOB_NODEFILE" -np {self.nodes} python3 ring.py {ROUNDS}
"""


@pytest.fixture(scope="module")
def site_files() -> Iterator[Path]:
    """A vjob site's store with debian12 in its catalogue (from the build cache: a 400 MB copy,
    made once for the module's cases)."""
    site = Path(tempfile.mkdtemp(prefix="vjob-mnslurm-", dir="/var/tmp"))
    site.chmod(0o755)
    try:
        user_pilot.prepare(site)
        yield site
    finally:
        shutil.rmtree(site, ignore_errors=True)


@pytest.fixture
def site(site_files: Path) -> Path:
    """The site for one case: an empty pilot directory (1777: the user's pilot writes there) and
    a fresh configuration readable by everyone (each case adds its own lines)."""
    pilots = site_files / "pilots"
    shutil.rmtree(pilots)
    pilots.mkdir(mode=0o1777)
    pilots.chmod(0o1777)  # the umask took the sticky and world bits
    user_pilot.write_config(site_files)
    return site_files


def _as_user_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`code` run as the test user by the system python3 with this checkout (as the shim does)."""
    user = pwd.getpwnam(USER)
    path = f"{REPO}:{sysconfig.get_paths()['purelib']}"
    env = [f"HOME={user.pw_dir}", f"USER={USER}", f"PYTHONPATH={path}", "PATH=/usr/bin:/bin"]
    return subprocess.run(
        ["runuser", "-u", USER, "--", "env", "-i", *env, "/usr/bin/python3", "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )


FORGET_AS_USER = """
import sys
from pilot.specs import user_provisioning
from provisioning.driver import Driver
from vjob.config import load
cfg = load(sys.argv[1])
with Driver(user_provisioning(cfg.provisioning), data_dir=cfg.data_path) as driver:
    for rank in range(int(sys.argv[3])):
        driver.delete(f"vjob-slurm-{sys.argv[2]}-{rank}", "node1")
"""


def _forget_vms(site: Path, job: str, case: Case) -> None:
    """The job's VMs and network, whatever state the run left them in (dev cluster job ids come
    round again when its state is wiped: a later run must not meet these). Every dev cluster
    node is this machine: node1's libvirt (root's, or the user's session) reaches them all."""
    if case.user:
        res = _as_user_python(FORGET_AS_USER, str(site / "vjob.toml"), job, str(case.nodes))
        # the node service's objects of the job (taps, bridge, chains), which its sweep would
        # remove later: gone now, whatever the pilots gave back
        gateway = nfs_ops.job_dir(network.pilot_subnet_id("slurm", job))
        gateway_left = gateway.exists()
        nfs_ops.stop_unrecorded(gateway)  # by the pid its own directory names, when it is ganesha of that directory
        left = network_ops.teardown(net_rules.job_net("slurm", job))
        assert res.returncode == 0, res.stderr[-2000:]
        assert not left, f"the job's network was left behind: {left}"
        assert not gateway_left, f"the job's NFS gateway was left running: {gateway}"
        return
    cfg = load(str(site / "vjob.toml"))
    with Driver(cfg.provisioning, data_dir=cfg.data_path) as driver:
        MPI.forget_job(driver, job, ["node1"], case.nodes)


@contextlib.contextmanager
def _job_removed(cluster: DevCluster, site: Path, job: str, case: Case) -> Iterator[None]:
    """The job cancelled and its VMs and network forgotten at the end, whatever happened; when
    the run failed, a failure of the clean-up is printed, not raised: it must not hide the first
    (a driver error says `from None` and pytest would show the clean-up's error alone)."""
    failed = True
    try:
        yield
        failed = False
    finally:
        subprocess.run(["scancel", job], env={**os.environ, **cluster.env}, timeout=30, check=False)
        try:
            _forget_vms(site, job, case)
        except Exception as exc:  # printed when the run failed, raised otherwise
            if not failed:
                raise
            print(f"clean-up of job {job} after the failure failed too: {exc}")


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


def submit(cluster: DevCluster, site: Path, case: Case, work: Path, files: dict[str, str]) -> str:
    """`sbatch --requeue job.sh` as the case's user would, in `work` holding `files`, with the
    site's configuration in the pilots' mode; the job id."""
    conf = site / "vjob.toml"
    conf.write_text(conf.read_text().replace("[agent]\n", f'[agent]\nmultinode_pilots = "{case.mode}"\n'))
    work.mkdir()
    for name, text in files.items():
        (work / name).write_text(text)
    env = {**cluster.env, "PATH": f"{site / 'bin'}:/usr/bin:/bin", "VJOB_CONFIG": str(conf)}
    sbatch = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "sbatch", "--parsable", "--requeue", "job.sh"]
    if case.user:
        user = _user()
        for p in (work, *(work / name for name in files)):
            os.chown(p, user.pw_uid, user.pw_gid)
        sbatch = ["runuser", "-u", USER, "--", *sbatch[:2], f"HOME={user.pw_dir}", *sbatch[2:]]
    res = subprocess.run(sbatch, cwd=work, capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _hold(cluster: DevCluster, job: str, out: Path, case: Case) -> tuple[str, float]:
    """`scontrol requeuehold` and the job held in the queue: the first run's output (the RMS
    truncates it when the job starts again) and the wall-clock time of the command. Cut by
    SIGTERM alone, the pilot must have saved every VM and exited on its own, before the SIGKILL
    KillWait (5 s) later: its `SIGTERM: exiting` line says so (a pilot SIGKILLed mid-cut never
    writes it)."""
    sent = time.time()
    _scontrol(cluster, "requeuehold", job)
    exited = (lambda: b"SIGTERM: exiting" in out.read_bytes()) if case.cut == "sigterm" else (lambda: True)
    wait_for(lambda: _job(cluster, job).get("JobState") == "PENDING" and exited(), 120, "the job held in the queue")
    return out.read_text(errors="replace"), sent


def _release_elsewhere(cluster: DevCluster, job: str, exclude: list[str]) -> None:
    """What the agent does with a held checkpointed job (plugins.slurm.adapter: release and
    StartTime=now), with the nodes it ran on excluded while it is held, so Slurm starts it on
    others and its VMs' states must be moved there."""
    held_at = time.monotonic()
    _scontrol(cluster, "update", f"JobId={job}", f"ExcNodeList={','.join(exclude)}")
    _scontrol(cluster, "release", job)
    time.sleep(max(0.0, held_at + 3 - time.monotonic()))  # the adapter's start_now: not in the requeue's second
    _scontrol(cluster, "update", f"JobId={job}", "StartTime=now")


def _run_and_move(
    cluster: DevCluster, site: Path, case: Case, job: str, out: Path
) -> tuple[str, str, list[str], float, float]:
    """Wait for round 3, cut as the case says, requeue onto other nodes, wait for the end: the
    first run's output, the whole output, the first run's nodes, the seconds from the submission
    to the script's first line in the guest (the user's `in DIR as USER`, root's ring's `boot
    rank 0`), and the wall-clock time of the requeuehold."""
    submitted = time.monotonic()
    wait_for(lambda: _printed(out, rb"^(in /|boot rank 0 )", cluster, job), 900, "the job's first line", interval=0.5)
    first_line_s = round(time.monotonic() - submitted, 1)
    wait_for(
        lambda: _printed(out, rb"^round %d " % CHECKPOINT_AT, cluster, job),
        900,
        f"the ring's round {CHECKPOINT_AT}",
        interval=1.0,
    )
    pdir = PilotDir(site / "pilots", "slurm", job)
    if case.cut == "request":  # what the agent does (agent.act): ask, wait for the answer, requeue
        pdir.request_checkpoint("mn-test", "test")
        wait_for(lambda: (st := pdir.read_state()) is not None and st.state is PilotState.SAVED, 300, "the cut")
    first_run, sent = _hold(cluster, job, out, case)  # "sigterm": Slurm's signal is the only word
    saved = pdir.read_state()
    assert saved is not None and saved.state is PilotState.SAVED, (saved, first_run[-4000:])
    assert len(saved.member_nodes) == case.nodes, saved
    first_nodes = list(saved.member_nodes)
    _release_elsewhere(cluster, job, first_nodes)
    wait_for(lambda: _job(cluster, job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"), 900, "the job's end")
    return first_run, out.read_text(errors="replace"), first_nodes, first_line_s, sent


def _check_sizes(first_run: str, case: Case) -> list[tuple[str, ...]]:
    """Every guest ran the user's commands as the user, with 2 vCPUs and 768 MiB less the VM's
    overhead (the tolerance of tests/test_realjob_slurm: the kernel's own reservations), and the
    job's key is not in the home."""
    sizes = SIZE_RE.findall(first_run)
    assert sorted(s[0] for s in sizes) == [f"vm{r}" for r in range(case.nodes)], first_run[-4000:]
    overhead = ProvisioningConfig().vm_overhead_mib
    for _vm, uid, cpus, kib, homekey in sizes:
        assert int(uid) == pwd.getpwnam(USER).pw_uid and int(cpus) == 2, sizes
        assert 768 - overhead - 96 <= int(kib) / 1024 <= 768 - overhead, sizes
        assert homekey == "no", sizes
    return sizes


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case(True, "per-node", 2), id="user-per-node-2"),
        pytest.param(Case(False, "leader", 2, "sigterm"), id="root-leader-2-sigterm"),
        pytest.param(Case(False, "per-node", 2, "sigterm"), marks=pytest.mark.soak, id="root-per-node-2-sigterm"),
        pytest.param(Case(False, "leader", 3), marks=pytest.mark.soak, id="root-leader-3"),
    ],
)
def test_an_mpi_ring_is_checkpointed_mid_run_and_finishes_on_other_nodes(
    request: pytest.FixtureRequest,
    wrapped_cluster: DevCluster,  # noqa: F811 - the fixture
    site: Path,
    case: Case,
) -> None:
    users: UserSite | None = None
    files = {"job.sh": case.script(), "ring.py": MPI.RING}
    if case.user:  # the job's network, NAT and NFS gateway come from the node service (root's)
        users = request.getfixturevalue("job_site")
        with (site / "vjob.toml").open("a") as fh:
            fh.write(f'[node]\nsocket = "{users.socket}"\n[guest]\n{users.guest}\n')
        files |= {"size.sh": SIZE_SH, "licence.py": checks.LICENCE_PY, "input.txt": f"{ROUNDS}\n"}
        files["node_port.txt"] = f"{users.net.node_port}\n"  # the node's own listener
    else:
        request.getfixturevalue("libvirt_system")  # root's libvirt: the leader's bridge and VMs
    t0 = time.monotonic()
    work = users.home(USER) / f"mntest-{os.getpid()}" if users else site / "work"
    job = ""
    try:
        job = submit(wrapped_cluster, site, case, work, files)
        out = work / f"slurm-{job}.out"
        with _job_removed(wrapped_cluster, site, job, case):
            first_run, text, first_nodes, first_line_s, sent = _run_and_move(wrapped_cluster, site, case, job, out)
            fields = _job(wrapped_cluster, job)
            assert fields.get("JobState") == "COMPLETED", text[-4000:]
        if users:
            _check_sizes(first_run, case)
            checks.check_taps(job, case.nodes, first_run, text)
            checks.check_site(users, job, work, first_run, text, ROUNDS)
        _check_ring(case, job, first_run, text, first_nodes, list(hostlist.expand(fields.get("NodeList", ""))))
        accounted = checks.sacct_row(wrapped_cluster, job) if users else []
    finally:
        shutil.rmtree(work, ignore_errors=True)  # root's too: the module's cases share the site
    _figure(case, first_run, text, (t0, sent), first_line_s, "|".join(accounted))
    if users:
        checks.check_sacct(accounted, text, [*first_nodes, *hostlist.expand(fields.get("NodeList", ""))])


@pytest.fixture
def job_site(wrapped_cluster: DevCluster) -> Iterator[UserSite]:  # noqa: F811 - the fixture
    """The /home and /scratch stand-ins, the site network and a node service serving both
    (tests/services/user_site.py)."""
    with user_site(wrapped_cluster, _user()) as users:
        yield users


def _check_ring(case: Case, job: str, first_run: str, text: str, first_nodes: list[str], second: list[str]) -> None:
    nodes = case.nodes
    # The cut was mid-run: the first run printed round 3 at least and never the end.
    first_rounds = re.findall(r"^round (\d+) ", first_run, re.M)
    assert len(first_rounds) >= CHECKPOINT_AT and not re.search(r"^final ", first_run, re.M), first_run[-4000:]
    # ...and one cut: every VM paused before any save.
    cuts = [json.loads(line) for line in first_run.splitlines() if '"coordinated checkpoint"' in line]
    assert len(cuts) == 1 and cuts[0]["consistent"] and len(cuts[0]["paused_at"]) == nodes, cuts
    assert max(cuts[0]["paused_at"].values()) <= min(cuts[0]["save_started_at"].values()), cuts[0]
    # Resumed on other nodes: every VM restored there from its node's state.
    assert len(second) == nodes and not set(second) & set(first_nodes), (first_nodes, second)
    restoring = f"restoring VM vjob-slurm-{job}-0 remotely (saved on {first_nodes[0]}) on {second[0]}"
    assert restoring in text and "booting VM" not in text.split("SIGTERM: exiting")[-1], text[-4000:]
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
    if case.mode == "per-node":
        assert [sorted(s) for s in set_up] == [sorted(first_nodes[1:]), sorted(second[1:])], set_up
    else:
        assert set_up == [[], []], set_up


def _figure(
    case: Case, first_run: str, text: str, times: tuple[float, float], first_line_s: float, accounted: str
) -> None:
    """The run's figures; `times`: the test's start (monotonic) and the requeuehold (wall clock,
    as the pilot logs: a cut by SIGTERM alone is timed from it)."""
    cuts = [json.loads(line) for line in first_run.splitlines() if '"coordinated checkpoint"' in line]
    restored = [json.loads(line) for line in text.splitlines() if '"multi-node job restored"' in line]
    t0, sent = times
    sigterm: dict[str, float] = {}
    if case.cut == "sigterm":
        all_saved = datetime.fromisoformat(cuts[0]["timestamp"].replace("Z", "+00:00")).timestamp()  # logged once saved
        sigterm = {
            "killwait_s": 5,
            "sigterm_to_first_pause_s": round(min(cuts[0]["paused_at"].values()) - sent, 3),
            "sigterm_to_all_saved_s": round(all_saved - sent, 3),
        }
    print(
        json.dumps(
            {
                "figure": "multinode_slurm",
                "user": case.user,
                "mode": case.mode,
                "vms": case.nodes,
                "cut": case.cut,
                "sizes": [list(s[2:4]) for s in SIZE_RE.findall(first_run)],
                "submit_to_first_line_s": first_line_s,
                "pause_to_saved_s": cuts[0]["pause_to_saved_s"],
                **sigterm,
                "restore_to_running_s": restored[0]["restore_to_running_s"] if restored else None,
                "test_s": round(time.monotonic() - t0, 1),
                "sacct": accounted,
                "load": os.getloadavg()[0],
            }
        )
    )
