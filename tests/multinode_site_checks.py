"""What an ordinary user's multi-node job on the dev cluster did with the site: the checks of
tests/test_multinode_slurm.py's user case (the /home and /scratch stand-ins, the licence server
reached by name through the job's NAT, the node service's taps, slurmdbd's record), kept apart
so that the test module holds the ring and its cut."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from devkit.devcluster import DevCluster
from plugins.slurm.accounting import usage_of
from provisioning import network
from provisioning.node_service import net_rules
from tests.services import site_network as sn
from tests.services.user_site import UserSite
from tests.test_realjob_slurm import USER, _user

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


def check_site(users: UserSite, job: str, work: Path, first_run: str, text: str, ring_rounds: int) -> None:
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
    check_first_vm_network(job, text)
    rounds = users.scratch(USER) / "rounds.txt"
    assert rounds.read_text().splitlines() == [f"round {r} counter {2 * r}" for r in range(1, ring_rounds + 1)]
    assert (work / "result.txt").read_text() == f"rounds {ring_rounds}\n"
    for f in (rounds, work / "result.txt", work / f"slurm-{job}.out"):
        assert (f.stat().st_uid, f.stat().st_gid) == (user.pw_uid, user.pw_gid), f


def check_first_vm_network(job: str, text: str) -> None:
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


def sacct_row(cluster: DevCluster, job: str) -> list[str]:
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


def check_sacct(row: list[str], text: str, nodes: list[str]) -> None:
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


def check_taps(job: str, nodes: int, first_run: str, text: str) -> None:
    """Each run's VMs were on the node service's taps: each pilot asked its own node's for its
    own VM's (vmID = rank + 1), once per run at least."""
    net = net_rules.job_net("slurm", job)
    want = {net.tap(rank + 1) for rank in range(nodes)}
    for run in (first_run, text):
        ups = [json.loads(line) for line in run.splitlines() if '"site network up"' in line]
        assert {tap for u in ups for tap in u["taps"]} == want and all(len(u["taps"]) == 1 for u in ups), ups
