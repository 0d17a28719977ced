"""A one-node vjob of an ordinary user on the operator's bridge (`[guest] network = "bridge"`).

The real-guest half of tests/test_guest_network_bridge.py: a plain `sbatch job.sh` by `vjrun` on
the dev cluster, the node service as root with `network = "bridge"` and the stand-in operator's
bridge (tests/services/site_network.py: the site's LAN behind it, dnsmasq as its DHCP server).
The pilot plugs the VM into its job tap and its site tap; the debian12 guest's agent asks the
site's DHCP for the site NIC's address, route and name server. The job's script prints both NICs,
the default route and resolv.conf, resolves licence.site.test, fetches the licence token (the
server sees the guest's own site address, not the node's), and fails to reach the node, on its
address on the operator's bridge (dropped) and on the job's gateway (refused). Slurm requeues the
job while the guest sleeps; restored, the guest has the same site address and does it all again.
Nothing of the job's network is left afterwards.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from devkit.devcluster import DevCluster
from provisioning import network
from provisioning.node_service import network_ops, site_bridge
from tests.services import site_network as sn
from tests.services import user_pilot, wait_for
from tests.services.node_service import running
from tests.test_realjob_slurm import USER, _user, wrapped_cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.realvm, pytest.mark.slow]

JOB = """#!/bin/bash
#SBATCH -N1 -c1 --mem=768M
#VJOB os=debian12
python3 probe.py before
sleep 30
python3 probe.py after
"""
PROBE = """import errno, fcntl, os, socket, struct, sys
when, job_gw = sys.argv[1], ""
for name in sorted(os.listdir("/sys/class/net")):
    if name != "lo":
        mac = open(f"/sys/class/net/{name}/address").read().strip()
        req = struct.pack("256s", name.encode())
        try:
            ip = socket.inet_ntoa(fcntl.ioctl(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), 0x8915, req)[20:24])
        except OSError:
            ip = "-"
        if ip.startswith("10."):
            job_gw = ip.rsplit(".", 1)[0] + ".254"
        print(when, "nic", name, mac, ip, flush=True)
gw = ""
for line in open("/proc/net/route").read().splitlines()[1:]:
    f = line.split()
    if f[1] == "00000000":
        gw = socket.inet_ntoa(struct.pack("<L", int(f[2], 16)))
print(when, "route default via", gw)
print(when, "dns", " ".join(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")))
ip = socket.gethostbyname("@NAME@")
print(when, "resolved @NAME@", ip)
with socket.create_connection((ip, @LICENCE@), timeout=20) as s:
    print(when, "licence", s.recv(200).decode().strip())
for what, host in (("gateway", job_gw), ("lan", "@NODE_LAN_IP@")):
    try:
        socket.create_connection((host, @NODE_PORT@), timeout=4).close()
        print(when, "node", what, host, "connected")
    except OSError as exc:
        print(when, "node", what, host, type(exc).__name__, errno.errorcode.get(exc.errno or 0, "-"), flush=True)
"""


def _prepare(top: Path, work: Path, site: sn.Site) -> Path:
    """The image (from the cache), the job's directory; the shim's directory. Before the node
    service starts: its test harness reads its notify socket only until READY=1, and a service
    whose watchdog datagrams fill that socket's queue (10 of them, one every 10 s) blocks."""
    bindir = user_pilot.prepare(top)
    probe = PROBE
    for key, value in {
        "@NAME@": sn.LICENCE_NAME,
        "@LICENCE@": str(sn.LICENCE_PORT),
        "@NODE_LAN_IP@": sn.NODE_LAN_IP,
        "@NODE_PORT@": str(site.node_port),
    }.items():
        probe = probe.replace(key, value)
    work.mkdir()
    (work / "job.sh").write_text(JOB)
    (work / "probe.py").write_text(probe)
    return bindir


def test_a_users_vjob_on_the_operators_bridge_gets_a_site_address(wrapped_cluster: DevCluster) -> None:  # noqa: F811
    user = _user()
    top = Path(tempfile.mkdtemp(prefix="vjob-n2brj-", dir="/var/tmp"))
    top.chmod(0o755)
    work = Path(user.pw_dir) / f"n2br-{os.getpid()}"
    site = sn.start()
    try:
        bridge = sn.operator_bridge(site, str(top))
        bindir = _prepare(top, work, site)
        for p in (work, work / "job.sh", work / "probe.py"):
            os.chown(p, user.pw_uid, user.pw_gid)
        with running(wrapped_cluster, f'network = "bridge"\nbridge = "{bridge}"', "vjob-n2br-") as service:
            conf = user_pilot.write_config(top, f'[node]\nsocket = "{service.socket}"\n')
            env = {**wrapped_cluster.env, "HOME": user.pw_dir, "PATH": f"{bindir}:/usr/bin:/bin"}
            env["VJOB_CONFIG"] = str(conf)
            _run_job(wrapped_cluster, env, work)
    finally:
        sn.stop(site)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)


def _run_job(cluster: DevCluster, env: dict[str, str], work: Path) -> None:
    """sbatch as the user, requeue while the guest sleeps, wait for the end; check its output."""
    cenv = {**os.environ, **cluster.env}
    argv = ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
    res = subprocess.run(
        [*argv, "sbatch", "--parsable", "--requeue", "job.sh"], cwd=work, capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    try:
        out = work / f"slurm-{job}.out"
        t0 = time.monotonic()

        def state() -> str:
            text = subprocess.run(["scontrol", "show", "job", job], env=cenv, capture_output=True, text=True).stdout
            m = re.search(r"JobState=(\S+)", text)
            return m.group(1) if m else ""

        wait_for(lambda: out.exists() and b"before node lan " in out.read_bytes(), 300, "the probe before the cut")
        first_probe_s = time.monotonic() - t0
        subprocess.run(["scontrol", "requeue", job], env=cenv, check=True, timeout=30, capture_output=True)
        wait_for(lambda: state() in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 600, f"job {job} to end")
        took = time.monotonic() - t0
        text = out.read_text(errors="replace")
        assert state() == "COMPLETED" and "restoring VM" in text, text[-3000:]
        _check(text, job)
        bridge = network.bridge_name(network.pilot_subnet_id("slurm", job))
        wait_for(lambda: not Path(f"/sys/class/net/{bridge}").exists(), 30, f"{bridge} removed after the job")
        own = network_ops.own_objects()
        assert not [n for n in own["links"] + own["chains"] + own["tables"] if bridge in n], own
        print(f"submission -> first probe {first_probe_s:.1f} s; -> end across a checkpoint {took:.1f} s")
        print("\n".join(line for line in text.splitlines() if line.startswith(("before ", "after ", "vjob: "))))
    finally:
        subprocess.run(["scancel", job], env=cenv, timeout=30, check=False)


def _check(text: str, job: str) -> None:
    """Both probes: the job NIC and the site NIC (its DHCP address, the same after the restore),
    the site's router and name server, the licence server seeing the guest's own address, the
    node dropped on the operator's bridge and refused on the job's gateway."""
    sub = network.pilot_subnet_id("slurm", job)
    job_mac, job_ip = network.pilot_addresses("slurm", job, ["x"])[0].mac, str(network.ip_address(sub, 1))
    site_mac = site_bridge.site_mac("slurm", job, 1)
    lines = text.splitlines()
    lo, hi = (ipaddress.IPv4Address(a) for a in sn.DHCP_RANGE)
    seen = []
    for when in ("before", "after"):
        assert any(re.fullmatch(rf"{when} nic \S+ {job_mac} {job_ip}", line) for line in lines), text[-3000:]
        site_nic = [line.split()[4] for line in lines if re.fullmatch(rf"{when} nic \S+ {site_mac} \S+", line)]
        assert len(site_nic) == 1 and lo <= ipaddress.IPv4Address(site_nic[0]) <= hi, text[-3000:]
        seen.append(site_nic[0])
        assert f"{when} route default via {sn.ROUTER_LAN_IP}" in lines, text[-3000:]
        assert f"{when} dns {sn.SITE_IP}" in lines and f"{when} resolved {sn.LICENCE_NAME} {sn.SITE_IP}" in lines
        licence = next((line for line in lines if line.startswith(f"{when} licence ")), "")
        assert licence.startswith(f"{when} licence {sn.TOKEN} {site_nic[0]} "), text[-3000:]
        gw = str(network.gateway_address(sub))
        assert f"{when} node gateway {gw} ConnectionRefusedError ECONNREFUSED" in lines, text[-3000:]
        # dropped: the node never answers the guest's ARP, so the guest's kernel gives up on the
        # address (EHOSTUNREACH) or the connection times out first
        dropped = (f"{when} node lan {sn.NODE_LAN_IP} {e}" for e in ("OSError EHOSTUNREACH", "TimeoutError -"))
        assert any(d in lines for d in dropped), text[-3000:]
    assert seen[0] == seen[1], seen
