"""A member pilot on a host that shares no filesystem with its leader (the second host of
tests/services/second_host.py: its own VM directory, reached by ssh and rsync).

The member's node lacks the batch step's working directory: it does not see the leader's probe,
so the leader builds that VM's job disk from its own directory and sends it by the configured
copy method (rsync over ssh), checked on arrival there; the member checks it once more on its
own host and defines its VM on its own libvirt (the second libvirtd) with it. The member runs as
a thread of the test (its driver reaches its node's files over ssh, as a member on that host
reads them locally); the connection, handshake and requests are the real ones.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pilot.members import link as member_link
from pilot.members.leader import Members
from pilot.members.member import Member
from provisioning import job_disk, network, transfer
from provisioning.driver import Driver, VMSpec
from provisioning.job_disk import JobDescription
from tests.services.second_host import SecondHost, second_host  # noqa: F401 - fixture

pytestmark = [pytest.mark.libvirt]
VM = "vjob-hosts-1"


@pytest.fixture
def hosts(second_host: SecondHost, libvirt_system: str) -> Iterator[tuple[Driver, SecondHost, Path]]:  # noqa: F811
    work = Path(tempfile.mkdtemp(prefix="vjob-mh-", dir="/var/tmp"))  # seen by both hosts: the image's place
    work.chmod(0o755)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(work / "base.qcow2"), "64M"], check=True, timeout=30)
    cfg = second_host.provisioning(libvirt_system, operation_timeout_s=120)
    driver = Driver(cfg, data_dir=work / "data")
    driver.delete(VM, "b")
    try:
        yield driver, second_host, work
    finally:
        driver.delete(VM, "b")
        driver.close()
        shutil.rmtree(work, ignore_errors=True)


def test_a_member_on_a_host_without_the_directory_gets_its_job_disk_by_the_copy_method(
    hosts: tuple[Driver, SecondHost, Path], tmp_path: Path
) -> None:
    driver, host, work = hosts
    leader_dir = tmp_path / "job"
    leader_dir.mkdir()
    (leader_dir / "input.txt").write_text("only on the leader's host\n")
    job = JobDescription(
        script=b"#!/bin/sh\ntrue\n",
        args=[],
        env={},
        uid=0,
        gid=0,
        user="root",
        home="/root",
        cwd=str(leader_dir),
        hostname="vm1",
    )
    disk = driver.job_disk_path(VM, "b")
    built: dict[str, Any] = {}

    def place_disk() -> dict[str, Any]:  # what JobVMs._place_disk does: the leader mode's build, then send
        disk.parent.mkdir(parents=True, exist_ok=True)
        job_disk.build(leader_dir, job, disk, limit_bytes=1 << 20, free_bytes=64 << 20)
        built["sha256"] = transfer.sha256_file(disk)
        return driver.place_job_disk(VM, "b")

    members = Members(["b"], host="127.0.0.1")
    given: list[Path | None] = []

    def member() -> None:
        link = member_link.connect(members.address, members.token, "b")

        def spec(_msg: dict[str, Any], vm: str, _rank: int, wd: Path | None) -> VMSpec:
            given.append(wd)
            return VMSpec(vm, work / "base.qcow2", memory_mib=96, job_disk=driver.job_disk_path(vm, "b"))

        Member(link, driver, "b", spec, None).serve()  # no working directory on its node

    thread = threading.Thread(target=member, daemon=True)
    thread.start()
    try:
        members.join(timeout_s=30)
        vm = members.vms([VM], 0x77, driver, 120)[0]
        vm.define({"job": {"cwd": str(leader_dir)}}, place_disk)
        assert given == [None]  # the member built nothing: the disk came from the leader
        assert not disk.exists()  # sent: the leader's copy removed
        assert host.exists(disk) and transfer.sha256(transfer.Endpoint(disk, host.ssh_host)) == built["sha256"]
        assert driver.connection("b").lookupByName(VM) is not None  # defined on the member's own libvirt
        assert [p.name for p in leader_dir.iterdir()] == ["input.txt"]  # the probe is gone
    finally:
        members.close(wait_s=1)
        thread.join(timeout=10)
        network.remove_bridge(driver.connection("b"), 0x77)  # the member made its node's bridge at define
