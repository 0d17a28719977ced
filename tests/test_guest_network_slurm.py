"""A one-node vjob of an ordinary user reaches the site network and not the node (issue 33, item 3).

A plain `sbatch job.sh` by the user `vjrun` on the dev cluster (qemu:///session, no privilege),
with the node service running as root (`vjob node-service`, `[guest] dns` the stand-in site's
name server): the pilot asks net.up before it boots, the guest gets a NIC on its tap (vmID 1 of
the job's /24), its default route via the node's gateway address and resolv.conf. The job's
script, in the guest, prints its NIC, route and name servers, resolves licence.site.test (the
site's name server, in a namespace: tests/services/site_network.py), fetches the licence
server's token through the node's NAT, and fails to connect to the node's listener, both on
its gateway address and on the node's site address. Slurm then requeues the job while the
guest sleeps (the pilot saves the VM and gives the network back; the restarted pilot asks for it
again, on whichever node Slurm chose, and restores the VM), and the guest does it all again with
the same address, route and name servers. After the job, nothing of its network is left on the
node (the pilot's net.down).
"""

from __future__ import annotations

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
from provisioning import network
from provisioning.node_service import network_ops
from tests.services import site_network as sn
from tests.services import user_pilot, wait_for
from tests.services.node_service import running
from tests.test_realjob_slurm import USER, _user, wrapped_cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.realvm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]

JOB = """#!/bin/bash
#SBATCH -N1 -c1 --mem=768M
#VJOB os=debian12
python3 probe.py before
sleep 30
python3 probe.py after
"""
PROBE = """import fcntl, os, socket, struct, sys
when = sys.argv[1]
for name in sorted(os.listdir("/sys/class/net")):
    if name != "lo":
        mac = open(f"/sys/class/net/{name}/address").read().strip()
        req = struct.pack("256s", name.encode())
        ip = socket.inet_ntoa(fcntl.ioctl(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), 0x8915, req)[20:24])
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
for host in (gw, "@HOST_IP@"):
    try:
        socket.create_connection((host, @NODE_PORT@), timeout=10).close()
        print(when, "node", host, "connected")
    except OSError as exc:
        print(when, "node", host, type(exc).__name__, flush=True)
"""


@pytest.fixture
def site_and_service(wrapped_cluster: DevCluster) -> Iterator[tuple[sn.Site, Path]]:  # noqa: F811
    """The stand-in site, and a node service whose `[guest] dns` is the site's name server;
    yields the site and the pilots' configuration (`[node] socket`)."""
    site = sn.start()
    try:
        with running(wrapped_cluster, f'network = "nat"\ndns = ["{sn.SITE_IP}"]', "vjob-n2svc-") as service:
            yield site, service.socket
    finally:
        sn.stop(site)


def test_a_users_one_node_vjob_reaches_the_site_and_not_the_node(
    wrapped_cluster: DevCluster,  # noqa: F811
    site_and_service: tuple[sn.Site, Path],
) -> None:
    site, sock = site_and_service
    user = _user()
    top = Path(tempfile.mkdtemp(prefix="vjob-n2net-", dir="/var/tmp"))
    top.chmod(0o755)
    work = Path(user.pw_dir) / f"n2net-{os.getpid()}"
    job = ""
    try:
        bindir = user_pilot.prepare(top)
        user_pilot.write_config(top, f'[node]\nsocket = "{sock}"\n')
        work.mkdir()
        probe = PROBE
        for key, value in {
            "@NAME@": sn.LICENCE_NAME,
            "@LICENCE@": str(sn.LICENCE_PORT),
            "@HOST_IP@": sn.HOST_IP,
            "@NODE_PORT@": str(site.node_port),
        }.items():
            probe = probe.replace(key, value)
        (work / "job.sh").write_text(JOB)
        (work / "probe.py").write_text(probe)
        for p in (work, work / "job.sh", work / "probe.py"):
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
        out = work / f"slurm-{job}.out"
        t0 = time.monotonic()
        cenv = {**os.environ, **wrapped_cluster.env}

        def state() -> str:
            text = subprocess.run(
                ["scontrol", "show", "job", job], env=cenv, capture_output=True, text=True, timeout=30
            ).stdout
            m = re.search(r"JobState=(\S+)", text)
            return m.group(1) if m else ""

        sub = network.pilot_subnet_id("slurm", job)
        me, gw = network.ip_address(sub, 1), network.gateway_address(sub)
        last = f"before node {sn.HOST_IP} "
        wait_for(lambda: out.exists() and last.encode() in out.read_bytes(), 300, "the probe before the checkpoint")
        first_probe_s = time.monotonic() - t0
        # checkpoint mid-run (the guest sleeps): the pilot saves and gives the network back; Slurm
        # starts the job again, the pilot asks the network again and restores the guest
        subprocess.run(["scontrol", "requeue", job], env=cenv, check=True, timeout=30, capture_output=True)
        wait_for(lambda: state() in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 600, f"job {job} to end")
        took = time.monotonic() - t0
        text = out.read_text(errors="replace")
        assert state() == "COMPLETED", text[-3000:]
        assert "restoring VM" in text, text[-3000:]
        mac = network.pilot_addresses("slurm", job, ["x"])[0].mac
        lines = text.splitlines()
        for when in ("before", "after"):  # the same NIC, route and name servers after the resume
            assert any(re.fullmatch(rf"{when} nic \S+ {mac} {me}", line) for line in lines), text[-3000:]
            assert f"{when} route default via {gw}" in lines and f"{when} dns {sn.SITE_IP}" in lines, text[-3000:]
            assert f"{when} resolved {sn.LICENCE_NAME} {sn.SITE_IP}" in lines, text[-3000:]
            licence = next((line for line in lines if line.startswith(f"{when} licence ")), "")
            assert licence.startswith(f"{when} licence {sn.TOKEN} {sn.HOST_IP} "), text[-3000:]
            assert f"{when} node {gw} ConnectionRefusedError" in lines, text[-3000:]
            assert f"{when} node {sn.HOST_IP} ConnectionRefusedError" in lines, text[-3000:]
        bridge = network.bridge_name(sub)
        wait_for(lambda: not Path(f"/sys/class/net/{bridge}").exists(), 30, f"{bridge} removed after the job")
        assert not [c for c in network_ops.own_objects()["chains"] if c.startswith(bridge)]
        print(f"submission -> first probe {first_probe_s:.1f} s; -> end across a checkpoint {took:.1f} s")
        print("\n".join(line for line in lines if line.startswith(("before ", "after ", "vjob: "))))
    finally:
        if job:
            subprocess.run(["scancel", job], env={**os.environ, **wrapped_cluster.env}, timeout=30, check=False)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)
