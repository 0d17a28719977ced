"""NFS throughput in a guest over the job's gateway against the same on the host directory.

    .venv/bin/python bench/nfs_throughput.py [--mib 64]   # as root

Prints one JSON line. A real debian12 guest (root's libvirt, TCG here) mounts a scratch
directory from the job's NFS gateway (nfs-ganesha started by the `nfs.up` operation on a job
bridge made here) and times, with `dd`, writing `--mib` MiB to it (conv=fsync: every byte on the
server's disk) and reading it back after dropping the guest's page cache; the host does the same
in the same directory. Both reads come from the host's page cache (the host file was just
written, and ganesha reads through it), so the read ratio is the cost of the NFS path (virtio-net,
TCG, ganesha), not of the disk. Fields: `*_write_mbs`, `*_read_mbs` (MB/s, 10^6 bytes), and the
ratios guest / host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devkit import libvirtd
from provisioning import image_build, images, job_disk, network
from provisioning.guest_config import GuestMount
from provisioning.images import Catalogue
from provisioning.node_service import nfs_ops
from vjob.config import ProvisioningConfig
from vjob.store.db import Store
from vjob.store.identities import mac_address

JOB = "940001"
SCRIPT = """#!/bin/sh
cd /scratch
t0=$(date +%s.%N); dd if=/dev/zero of=f bs=1M count={mib} conv=fsync 2>/dev/null; t1=$(date +%s.%N)
echo 3 > /proc/sys/vm/drop_caches
t2=$(date +%s.%N); dd if=f of=/dev/null bs=1M 2>/dev/null; t3=$(date +%s.%N)
echo "times $t0 $t1 $t2 $t3"
rm -f f
"""


def _dd_host(directory: Path, mib: int) -> tuple[float, float]:
    f = directory / "host.bin"
    t0 = time.monotonic()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={f}", "bs=1M", f"count={mib}", "conv=fsync"], check=True, capture_output=True
    )
    t1 = time.monotonic()
    subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    t2 = time.monotonic()
    f.unlink()
    return t1 - t0, t2 - t1


def _guest(base: Path, scratch: Path, mib: int) -> tuple[float, float]:
    from provisioning.driver import Driver, VMSpec  # heavy: libvirt-python
    from provisioning.vm_types import Nic

    store = Store(f"sqlite:///{base / 'vjob.sqlite'}")
    store.upgrade()
    image_build.build(Catalogue(store, ProvisioningConfig(), data_dir=base / "data"), "debian12")
    store.close()
    sub = network.pilot_subnet_id("slurm", JOB)
    bridge, gateway = network.bridge_name(sub), network.gateway_address(sub)
    mounts = [GuestMount(source=str(scratch), target="/scratch")]
    nfs_ops.STATE_DIR = base / "nfs"
    state = nfs_ops.job_dir(sub)
    prov = ProvisioningConfig(vm_dir=str(base / "vms"), snapshot_dir=str(base / "snaps"))
    driver = Driver(prov, data_dir=base / "data")
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{gateway}/24", "dev", bridge], check=True, capture_output=True)
        subprocess.run(["ip", "link", "set", bridge, "up"], check=True, capture_output=True)
        nfs_ops.start(state, nfs_ops.Record("slurm", JOB, 0, 0, sub, nodes=["n1"]), mounts)
        ans = nfs_ops.answer(sub, mounts)
        mac, ip = mac_address(network.PILOT_MAC_PREFIX, sub, 1), str(network.ip_address(sub, 1))
        job = job_disk.JobDescription(
            script=SCRIPT.format(mib=mib).encode(),
            args=[],
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            uid=0,
            gid=0,
            user="root",
            home="/root",
            cwd="/root/work",
            hostname="vm0",
            network={"mac": mac, "ip": ip, "prefix": 24, "peers": [[ip, "vm0"]], "leader": True},
            mounts={
                "server": ans["server"],
                "port": ans["port"],
                "exports": [{"export": "/vjob/0", "target": "/scratch", "options": []}],
            },
        )
        (base / "vms").mkdir()
        (base / "work").mkdir()
        disk = base / "vms" / "nfsbench.job.qcow2"
        job_disk.build(base / "work", job, disk, limit_bytes=1 << 20, free_bytes=16 << 20)
        local = images.local_image(prov, base / "data", "localhost", "debian12")
        assert local is not None and local.kernel is not None and local.initrd is not None
        spec = VMSpec(
            name="nfsbench",
            image=local.path,
            image_format=local.format,
            memory_mib=512,
            kernel=local.kernel,
            initrd=local.initrd,
            cmdline=local.cmdline,
            job_disk=disk,
            output_ports=True,
            cpu_model="qemu64",
            nics=(Nic(mac, bridge),),
        )
        driver.define(spec, "localhost")
        driver.boot("nfsbench", "localhost")
        out = driver.output_logs("nfsbench", "localhost")[0]
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            m = re.search(
                r"^times (\S+) (\S+) (\S+) (\S+)$", out.read_text(errors="replace") if out.exists() else "", re.M
            )
            if m:
                t = [float(x) for x in m.groups()]
                return t[1] - t[0], t[3] - t[2]
            time.sleep(2)
        raise SystemExit(f"no timing from the guest; console: {driver.console_log('nfsbench', 'localhost')}")
    finally:
        try:
            driver.delete("nfsbench", "localhost")
        finally:
            rec = nfs_ops.read_record(state)
            if rec is not None:
                nfs_ops.stop(rec.pid, state)
            subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
            driver.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/nfs_throughput.py: run as root (libvirt's system instance, the NFS gateway)", file=sys.stderr)
        return 2
    daemons = libvirtd.start_system(Path(tempfile.mkdtemp(prefix="vjob-nfsbench-log-")))
    base = Path(tempfile.mkdtemp(prefix="vjob-nfsbench-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        scratch = base / "scratch"
        scratch.mkdir(mode=0o755)  # the gateway squashes every uid to the job's: root here
        host_w, host_r = _dd_host(scratch, args.mib)
        guest_w, guest_r = _guest(base, scratch, args.mib)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        libvirtd.stop(daemons)
    mb = args.mib * 2**20 / 1e6
    result = {
        "bench": "nfs_throughput",
        "mib": args.mib,
        "guest_write_mbs": round(mb / guest_w, 1),
        "guest_read_mbs": round(mb / guest_r, 1),
        "host_write_mbs": round(mb / host_w, 1),
        "host_read_mbs": round(mb / host_r, 1),
    }
    result["write_ratio"] = round(result["guest_write_mbs"] / result["host_write_mbs"], 3)
    result["read_ratio"] = round(result["guest_read_mbs"] / result["host_read_mbs"], 3)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
