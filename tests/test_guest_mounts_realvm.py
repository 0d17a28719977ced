"""One real guest on the site's filesystems (issue 33, item 2): /home and /scratch stand-ins
served by the job's NFS gateway (real nfs-ganesha started by the `nfs.up` operation), mounted by
the guest agent of the real debian12 image; the working directory used in place; the guest's
root trying other uids; a checkpoint mid-run resumed while the gateway is down.

Why the guest's root runs the script here (job.json uid 0) while the gateway squashes to the
ordinary user `vjobtest`: that is the threat itself — a user who is root in their guest (their
own image, a kernel bug) claims any uid over sec=sys — and the gateway's answer must be the same
as for the user: their files yes, anybody else's no. The pilot's own path (a user's job with
the node service) reaches the same gateway through the same operation.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioning import image_build, images, job_disk, network
from provisioning.images import Catalogue
from provisioning.node_service import nfs_ops, protocol, site
from provisioning.node_service.grant import Grant
from provisioning.vm_types import Nic
from tests.services import wait_for
from tests.services.nfs import job_bridge, nfs_state  # noqa: F401 - a fixture
from vjob.config import ProvisioningConfig, load
from vjob.store.db import Store
from vjob.store.identities import mac_address

pytestmark = [pytest.mark.realvm, pytest.mark.slow]
USER, JOB, ROUNDS = "vjobtest", "930001", 20
"""One round a second: 8 before the checkpoint, 12 after it (40 made the run 20 s longer, checking nothing more)."""
SCRIPT = f"""#!/bin/bash
echo "start as uid $(id -u) in $(pwd)"
cat input.txt
grep -c ' nfs4 ' /proc/mounts
attempt() {{ name=$1; shift; "$@" >/dev/null 2>&1 && echo "LEAK-$name" || echo "DENIED-$name"; }}
as_uid1="setpriv --reuid=1 --regid=1 --clear-groups"
echo "link: $(readlink escape)"
attempt link cat escape/marker
attempt root-read cat /home/other/secret
attempt uid1-read $as_uid1 cat /home/other/secret
attempt uid1-write $as_uid1 touch /home/other/private/x
attempt root-write touch /home/other/private/y
attempt py python3 -c 'import os; os.setgid(1); os.setuid(1); open("/home/other/secret").read()'
exec 3>>/scratch/vjobtest/held.txt
for i in $(seq 1 {ROUNDS}); do
  echo "round $i" >> /scratch/vjobtest/rounds.txt; echo "held $i" >&3; echo "progress $i"; sleep 1
done
exec 3>&-
echo done > result.txt
exit 3
"""


def _user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", USER], check=True, timeout=30)
        return pwd.getpwnam(USER)


@pytest.fixture
def site_dir(libvirt_system: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The image, /home and /scratch stand-ins (the user's files and another user's, uid 1's),
    a directory outside both, and the site configuration declaring the two mounts."""
    base = Path(tempfile.mkdtemp(prefix="vjob-site-", dir="/var/tmp"))
    base.chmod(0o755)  # QEMU (libvirt-qemu) reaches the image below
    try:
        store = Store(f"sqlite:///{base / 'vjob.sqlite'}")
        store.upgrade()
        image_build.build(Catalogue(store, ProvisioningConfig(), data_dir=base / "data"), "debian12")
        store.close()
        u = _user()
        home, scratch, outside = base / "home", base / "scratch", base / "outside"
        for d, owner, mode in (
            (home, (0, 0), 0o755),
            (scratch, (0, 0), 0o755),
            (outside, (0, 0), 0o755),
            (home / USER, (u.pw_uid, u.pw_gid), 0o755),
            (home / USER / "work", (u.pw_uid, u.pw_gid), 0o755),
            (scratch / USER, (u.pw_uid, u.pw_gid), 0o700),
            (home / "other", (1, 1), 0o755),
            (home / "other" / "private", (1, 1), 0o700),
        ):
            d.mkdir()
            os.chown(d, *owner)
            d.chmod(mode)
        (outside / "marker").write_text("HOST-ONLY\n")
        (home / "other" / "secret").write_text("SECRET-OF-UID-1\n")
        os.chown(home / "other" / "secret", 1, 1)
        (home / "other" / "secret").chmod(0o600)
        (home / USER / "work" / "input.txt").write_text("seed-42\n")
        os.symlink(outside, home / USER / "work" / "escape")
        mounts = f'{{source = "{home}", target = "/home"}}, {{source = "{scratch}", target = "/scratch"}}'
        guest = f'[guest]\nnetwork = "none"\nmounts = [{mounts}]\n'
        (base / "vjob.toml").write_text(f'data_dir = "{base / "data"}"\n{guest}')
        monkeypatch.setattr(site, "_current", None)
        site.install(load(base / "vjob.toml"))
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _nfs(op: str, grant: Grant) -> dict[str, Any]:
    request = protocol.check({"op": op, "job": grant.job, "node": grant.node}, nfs_ops.OPERATIONS)
    return nfs_ops.OPERATIONS[op].run(grant, request.fields)


def _rounds(path: Path) -> list[int]:
    return [int(line.split()[1]) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.usefixtures("nfs_state")
def test_a_guest_mounts_the_site_filesystems_acts_as_its_user_and_keeps_them_across_a_checkpoint(
    site_dir: Path,
) -> None:
    from provisioning.driver import Driver, VMSpec  # heavy: libvirt-python

    u = _user()
    grant = Grant("slurm", JOB, u.pw_uid, u.pw_gid, USER, "node1", ("node1",), 1, 1024)
    prov = ProvisioningConfig(vm_dir=str(site_dir / "vms"), snapshot_dir=str(site_dir / "snaps"))
    driver = Driver(prov, data_dir=site_dir / "data")
    work, scratch = site_dir / "home" / USER / "work", site_dir / "scratch" / USER
    with job_bridge("slurm", JOB) as sub:
        try:
            answer = _nfs("nfs.up", grant)
            mac, ip = mac_address(network.PILOT_MAC_PREFIX, sub, 1), str(network.ip_address(sub, 1))
            exports = [{k: v for k, v in e.items() if k != "source"} for e in answer["exports"]]
            job = job_disk.JobDescription(
                script=SCRIPT.encode(),
                args=[],
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                uid=0,  # the guest's root: see the module's docstring
                gid=0,
                user="root",
                home="/root",
                cwd=f"/home/{USER}/work",
                hostname="vm0",
                network={"mac": mac, "ip": ip, "prefix": 24, "peers": [[ip, "vm0"]], "leader": True},
                mounts={"server": answer["server"], "port": answer["port"], "exports": exports},
            )
            assert job.in_place
            (site_dir / "vms").mkdir()
            disk = site_dir / "vms" / "nfsvm.job.qcow2"
            job_disk.build(work, job, disk, limit_bytes=1 << 20, free_bytes=16 << 20)
            local = images.local_image(prov, site_dir / "data", "localhost", "debian12")
            assert local is not None and local.kernel is not None and local.initrd is not None
            spec = VMSpec(
                name="nfsvm",
                image=local.path,
                image_format=local.format,
                memory_mib=512,
                kernel=local.kernel,
                initrd=local.initrd,
                cmdline=local.cmdline,
                job_disk=disk,
                output_ports=True,
                cpu_model="qemu64",
                nics=(Nic(mac, network.bridge_name(sub)),),
            )
            driver.define(spec, "localhost")
            driver.boot("nfsvm", "localhost")
            stdout = driver.output_logs("nfsvm", "localhost")[0]
            wait_for(lambda: len(_rounds(scratch / "rounds.txt")) >= 8, 300, "8 rounds on /scratch")
            driver.save("nfsvm", "localhost")  # the VM stops: what Slurm's requeue makes the pilot do
            before = _rounds(scratch / "rounds.txt")
            assert len(before) < ROUNDS, "the job ended before its checkpoint"
            assert _nfs("nfs.down", grant) == {"stopped": True}
            driver.restore("nfsvm", "localhost", from_node="localhost")  # the gateway is still down
            # the guest runs on and tries its next rounds (a round a second) with the gateway down:
            # none may land; 8 s is several rounds, and a shorter outage is also a shorter NFS back-off
            time.sleep(8)
            assert _rounds(scratch / "rounds.txt") == before, "a round landed with the gateway down"
            t0 = time.monotonic()
            _nfs("nfs.up", grant)
            wait_for(lambda: len(_rounds(scratch / "rounds.txt")) > len(before), 120, "a round after the resume")
            resumed_s = time.monotonic() - t0
            wait_for(lambda: (work / "result.txt").exists(), 300, "the job's end")
            text = stdout.read_text(errors="replace")
            assert _rounds(scratch / "rounds.txt") == list(range(1, ROUNDS + 1)), text[-2000:]
            assert [int(x.split()[1]) for x in (scratch / "held.txt").read_text().splitlines()] == list(
                range(1, ROUNDS + 1)
            )
            assert "seed-42" in text and "\n2\n" in text  # the input read in place; two nfs4 mounts
            assert f"link: {site_dir / 'outside'}" in text and "LEAK" not in text and "SECRET" not in text, text
            for attempt in ("link", "root-read", "uid1-read", "uid1-write", "root-write", "py"):
                assert f"DENIED-{attempt}" in text, text
            for f in (work / "result.txt", scratch / "rounds.txt", scratch / "held.txt"):
                assert (f.stat().st_uid, f.stat().st_gid) == (u.pw_uid, u.pw_gid)  # the guest's root is the user
            assert not (site_dir / "home" / "other" / "private" / "x").exists()
            print(f"first round landed {resumed_s:.1f} s after the gateway came back ({len(before)} rounds before)")
        finally:
            try:
                driver.delete("nfsvm", "localhost")
            finally:
                _nfs("nfs.down", grant)
                driver.close()
