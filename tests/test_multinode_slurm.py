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

Root variants (soak, each a whole second run, over CI's budget): the leader mode with 2 and 3
nodes (the first node's pilot drives every VM through root's libvirt, the bridge made by that
libvirt) and root's per-node pilots; they run `mpirun --allow-run-as-root`, staged, no site.
"""

from __future__ import annotations

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
from pathlib import Path

import pytest

from devkit.devcluster import DevCluster
from plugins.slurm import hostlist
from plugins.slurm.accounting import usage_of
from provisioning import network
from provisioning.driver import Driver
from provisioning.node_service import net_rules, network_ops, nfs_ops
from tests import bench_scripts
from tests.services import site_network as sn
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
LICENCE_PY = f"""import fcntl, os, socket, struct, sys
when, node_port = sys.argv[1], int(sys.argv[2])
ip = socket.gethostbyname("{sn.LICENCE_NAME}")
with socket.create_connection((ip, {sn.LICENCE_PORT}), timeout=20) as s:
    print("licence", when, ip, s.recv(200).decode().strip(), flush=True)
for name in sorted(os.listdir("/sys/class/net")):
    if name != "lo":
        req = struct.pack("256s", name.encode())
        addr = fcntl.ioctl(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), 0x8915, req)[20:24]
        mac = open(f"/sys/class/net/{{name}}/address").read().strip()
        print("nic", when, mac, socket.inet_ntoa(addr), flush=True)
gw = ""
for line in open("/proc/net/route").read().splitlines()[1:]:
    f = line.split()
    if f[1] == "00000000":
        gw = socket.inet_ntoa(struct.pack("<L", int(f[2], 16)))
print("route", when, gw)
print("dns", when, " ".join(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")))
for host in (gw, "{sn.HOST_IP}"):
    try:
        socket.create_connection((host, node_port), timeout=10).close()
        print("node", when, host, "connected", flush=True)
    except OSError as exc:
        print("node", when, host, type(exc).__name__, flush=True)
"""
"""What the first VM sees of the site, run before the ring and after it: the licence token
fetched by name (the site's name server resolves it, the token comes back with the address the
server saw: the node's, through the job's NAT); its NIC, default route and name servers (the
same after the restore); and the node's own listener (argv[2]) refused on the job's gateway
address and on the node's site address."""


@dataclass(frozen=True)
class Case:
    """Who submits, the pilots' mode, the node count, the job's size options."""

    user: bool
    mode: str
    nodes: int

    def script(self) -> str:
        if self.user:
            return USER_JOB.replace("@NODES@", str(self.nodes))
        return f"""#!/bin/bash
#SBATCH -N{self.nodes}
#VJOB os=debian12
set -e
mpirun --allow-run-as-root --hostfile "$VJOB_NODEFILE" -np {self.nodes} python3 ring.py {ROUNDS}
"""


@pytest.fixture
def site() -> Iterator[Path]:
    """A vjob site: debian12 in its catalogue (cached build), its pilot directory (1777: the
    user's pilot writes there), its configuration readable by everyone."""
    site = Path(tempfile.mkdtemp(prefix="vjob-mnslurm-", dir="/var/tmp"))
    site.chmod(0o755)
    try:
        user_pilot.prepare(site)
        user_pilot.write_config(site)
        yield site
    finally:
        shutil.rmtree(site, ignore_errors=True)


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


def _run_and_move(
    cluster: DevCluster, site: Path, case: Case, job: str, out: Path
) -> tuple[str, str, list[str], float]:
    """Wait for round 3, checkpoint as the agent does, requeue onto other nodes, wait for the end:
    the first run's output, the whole output, the first run's nodes, and the seconds from the
    submission to the script's first line in the guest (the user's `in DIR as USER`, root's ring's
    `boot rank 0`)."""
    submitted = time.monotonic()
    wait_for(lambda: _printed(out, rb"^(in /|boot rank 0 )", cluster, job), 900, "the job's first line", interval=0.5)
    first_line_s = round(time.monotonic() - submitted, 1)
    wait_for(
        lambda: _printed(out, rb"^round %d " % CHECKPOINT_AT, cluster, job),
        900,
        f"the ring's round {CHECKPOINT_AT}",
        interval=1.0,
    )
    # What the agent does (agent.act): ask the pilot for a checkpoint, wait for its answer, requeue.
    pdir = PilotDir(site / "pilots", "slurm", job)
    pdir.request_checkpoint("mn-test", "test")
    wait_for(lambda: (st := pdir.read_state()) is not None and st.state is PilotState.SAVED, 300, "the cut")
    saved = pdir.read_state()
    assert saved is not None and len(saved.member_nodes) == case.nodes, saved
    first_nodes = list(saved.member_nodes)
    first_run = out.read_text(errors="replace")  # the RMS truncates the output at the requeue
    _requeue_elsewhere(cluster, job, first_nodes)
    wait_for(lambda: _job(cluster, job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"), 900, "the job's end")
    return first_run, out.read_text(errors="replace"), first_nodes, first_line_s


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
        pytest.param(Case(False, "leader", 2), marks=pytest.mark.soak, id="root-leader-2"),
        pytest.param(Case(False, "per-node", 2), marks=pytest.mark.soak, id="root-per-node-2"),
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
        files |= {"size.sh": SIZE_SH, "licence.py": LICENCE_PY, "input.txt": f"{ROUNDS}\n"}
        files["node_port.txt"] = f"{users.net.node_port}\n"  # the node's own listener
    else:
        request.getfixturevalue("libvirt_system")  # root's libvirt: the leader's bridge and VMs
    t0 = time.monotonic()
    work = users.home(USER) / f"mntest-{os.getpid()}" if users else site / "work"
    job = ""
    try:
        job = submit(wrapped_cluster, site, case, work, files)
        out = work / f"slurm-{job}.out"
        try:
            first_run, text, first_nodes, first_line_s = _run_and_move(wrapped_cluster, site, case, job, out)
            fields = _job(wrapped_cluster, job)
            assert fields.get("JobState") == "COMPLETED", text[-4000:]
        finally:
            subprocess.run(["scancel", job], env={**os.environ, **wrapped_cluster.env}, timeout=30, check=False)
            _forget_vms(site, job, case)
        if users:
            _check_sizes(first_run, case)
            _check_taps(job, case, first_run, text)
            _check_site(users, job, work, first_run, text)
        _check_ring(case, job, first_run, text, first_nodes, list(hostlist.expand(fields.get("NodeList", ""))))
        accounted = _sacct_row(wrapped_cluster, job) if users else []
    finally:
        if case.user:
            shutil.rmtree(work, ignore_errors=True)
    _figure(case, first_run, text, t0, first_line_s, "|".join(accounted))
    if users:
        _check_sacct(accounted, text, [*first_nodes, *hostlist.expand(fields.get("NodeList", ""))])


@pytest.fixture
def job_site(wrapped_cluster: DevCluster) -> Iterator[UserSite]:  # noqa: F811 - the fixture
    """The /home and /scratch stand-ins, the site network and a node service serving both
    (tests/services/user_site.py)."""
    with user_site(wrapped_cluster, _user()) as users:
        yield users


def _check_site(users: UserSite, job: str, work: Path, first_run: str, text: str) -> None:
    """The job used the site: it ran in place in its directory on /home (nothing staged: the
    pilot says so), read its input there, reached the licence server by name through the NAT
    before and after the checkpoint, and wrote every round to /scratch once, in order, as the
    user."""
    user = _user()
    assert f"in /home/{USER}/{work.name} as {USER}" in text, text[-4000:]
    assert '"working directory used in place on the site\'s filesystem"' in first_run, first_run[-4000:]
    lines = text.splitlines()
    for when in ("before", "after"):
        fetched = [line for line in lines if line.startswith(f"licence {when} ")]
        assert len(fetched) == 1, text[-4000:]
        assert fetched[0].startswith(f"licence {when} {sn.SITE_IP} {sn.TOKEN} {sn.HOST_IP} "), fetched
    assert [line for line in first_run.splitlines() if line.startswith("licence ")] == [
        next(line for line in lines if line.startswith("licence before "))
    ], first_run[-4000:]
    _check_first_vm_network(job, text)
    rounds = users.scratch(USER) / "rounds.txt"
    assert rounds.read_text().splitlines() == [f"round {r} counter {2 * r}" for r in range(1, ROUNDS + 1)]
    assert (work / "result.txt").read_text() == f"rounds {ROUNDS}\n"
    for f in (rounds, work / "result.txt", work / f"slurm-{job}.out"):
        assert (f.stat().st_uid, f.stat().st_gid) == (user.pw_uid, user.pw_gid), f


def _check_first_vm_network(job: str, text: str) -> None:
    """Before and after the restore, the first VM has the same NIC (the job's MAC and vmID 1 of
    its /24), its default route via the job's gateway and the site's name server; the node's own
    listener refuses it on the gateway address and on the node's site address."""
    sub = network.pilot_subnet_id("slurm", job)
    me, gw = network.ip_address(sub, 1), network.gateway_address(sub)
    mac = network.pilot_addresses("slurm", job, ["vm0"])[0].mac
    lines = text.splitlines()
    for when in ("before", "after"):
        assert f"nic {when} {mac} {me}" in lines, text[-4000:]
        assert f"route {when} {gw}" in lines and f"dns {when} {sn.SITE_IP}" in lines, text[-4000:]
        for host in (gw, sn.HOST_IP):
            assert f"node {when} {host} ConnectionRefusedError" in lines, text[-4000:]


def _sacct_row(cluster: DevCluster, job: str) -> list[str]:
    """slurmdbd's record of the job, `sacct -j JOB -o JobID,State,ExitCode,TotalCPU,AdminComment -P`
    as an operator types it: the job's own line once it is COMPLETED with the VMs' usage in it,
    or whatever it holds after 60 s (slurmctld sends the record at the job's end)."""
    env = {"PATH": "/usr/bin:/bin", **cluster.env}
    argv = ["sacct", "-j", job, "-n", "-P", "-o", "JobID,State,ExitCode,TotalCPU,AdminComment"]
    end = time.monotonic() + 60
    while True:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=True).stdout
        mine = [line.split("|", 4) for line in out.splitlines() if line.split("|", 1)[0] == job]
        row = mine[-1] if mine else []
        if (row and row[1] == "COMPLETED" and "vjob-usage@" in row[4]) or time.monotonic() > end:
            return row
        time.sleep(1)


def _check_sacct(row: list[str], text: str, nodes: list[str]) -> None:
    """COMPLETED, exit 0:0, the job's CPU time, and the VMs' CPU seconds that the node service
    wrote into its AdminComment (plugins.slurm.accounting: `vjob-usage@NODE:cpu_s=…`): one run
    on each node of each run — the first run's, written while Slurm winds the requeue up, too —
    and each node's VM only (the dev cluster's nodes share one machine: a node counting its
    neighbour's VM would show the same figures twice)."""
    assert len(row) == 5 and row[1] == "COMPLETED", f"sacct: {row}"
    _id, _state, exit_code, total_cpu, comment = row
    assert exit_code == "0:0" and re.fullmatch(r"(\d+-)?(\d+:)?\d+:\d+(\.\d+)?", total_cpu), row
    usage = usage_of(comment)
    said = [line for line in text.splitlines() if "usage" in line]  # the pilots' word on it
    assert set(usage) == set(nodes), f"usage of nodes {sorted(usage)}, the runs' nodes {nodes}: {row} {said}"
    assert all(u.runs == 1 and u.cpu_s > 0 for u in usage.values()), f"{row} {said}"
    figures = [(u.cpu_s, u.peak_mib) for u in usage.values()]
    assert len(set(figures)) == len(figures), f"two nodes with the same figures (one VM counted twice?): {row}"


def _check_taps(job: str, case: Case, first_run: str, text: str) -> None:
    """Each run's VMs were on the node service's taps: each pilot asked its own node's for its
    own VM's (vmID = rank + 1), once per run at least."""
    net = net_rules.job_net("slurm", job)
    want = {net.tap(rank + 1) for rank in range(case.nodes)}
    for run in (first_run, text):
        ups = [json.loads(line) for line in run.splitlines() if '"site network up"' in line]
        assert {tap for u in ups for tap in u["taps"]} == want and all(len(u["taps"]) == 1 for u in ups), ups


def _check_ring(case: Case, job: str, first_run: str, text: str, first_nodes: list[str], second: list[str]) -> None:
    nodes = case.nodes
    # The cut was mid-run: the first run printed round 3 at least and never the end.
    first_rounds = re.findall(r"^round (\d+) ", first_run, re.M)
    assert len(first_rounds) >= CHECKPOINT_AT and not re.search(r"^final ", first_run, re.M), first_run[-4000:]
    # ...and one cut: every VM paused before any save.
    cuts = [json.loads(line) for line in first_run.splitlines() if '"coordinated checkpoint"' in line]
    assert cuts and all(c["consistent"] for c in cuts), cuts
    assert len(cuts[0]["paused_at"]) == nodes, cuts[0]
    assert max(cuts[0]["paused_at"].values()) <= min(cuts[0]["save_started_at"].values()), cuts[0]
    # Resumed on other nodes: every VM restored there from its node's state.
    assert len(second) == nodes and not set(second) & set(first_nodes), (first_nodes, second)
    restoring = f"restoring VM vjob-slurm-{job}-0 remotely (saved on {first_nodes[0]}) on {second[0]}"
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
    if case.mode == "per-node":
        assert [sorted(s) for s in set_up] == [sorted(first_nodes[1:]), sorted(second[1:])], set_up
    else:
        assert set_up == [[], []], set_up


def _figure(case: Case, first_run: str, text: str, t0: float, first_line_s: float, accounted: str) -> None:
    cuts = [json.loads(line) for line in first_run.splitlines() if '"coordinated checkpoint"' in line]
    restored = [json.loads(line) for line in text.splitlines() if '"multi-node job restored"' in line]
    print(
        json.dumps(
            {
                "figure": "multinode_slurm",
                "user": case.user,
                "mode": case.mode,
                "vms": case.nodes,
                "sizes": [list(s[2:4]) for s in SIZE_RE.findall(first_run)],
                "submit_to_first_line_s": first_line_s,
                "pause_to_saved_s": cuts[0]["pause_to_saved_s"],
                "restore_to_running_s": restored[0]["restore_to_running_s"] if restored else None,
                "test_s": round(time.monotonic() - t0, 1),
                "sacct": accounted,
                "load": os.getloadavg()[0],
            }
        )
    )
