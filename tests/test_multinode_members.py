"""Per-node pilots' protocol on libvirt's test driver (agent.member_leader, agent.pilot_member).

The leader and its member pilots talk over real TCP with the real handshake; the members run
as threads here (test-driver domains live in one process), each driving its own node's VM.
A member "killed" is one whose connection is cut at the named moment, as the kernel does for a
SIGKILLed process. The real launch by srun is test_multinode_slurm.py's per-node case.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libvirt
import pytest

from agent import member_link
from agent.member_leader import Members, MemberVM
from agent.member_link import LinkError
from agent.pilot_member import Member
from agent.pilot_multinode import JobVMs
from provisioning import coordinated
from provisioning.driver import Driver, DriverError, VMSpec
from tests.services.libvirt import make_test_node
from vjob.config import ProvisioningConfig
from vjob.model import VMState

pytestmark = pytest.mark.libvirt

NODES = ["n1", "n2", "n3"]
NAMES = ["job9-0", "job9-1", "job9-2"]
SUBNET = 0x99
VMS = list(zip(NAMES, NODES, strict=True))


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Driver]:
    nodes = {n: make_test_node(tmp_path / "nodes", n) for n in NODES}
    cfg = ProvisioningConfig(nodes=nodes, snapshot_dir=str(tmp_path / "snap" / "{node}"), operation_timeout_s=30)
    with Driver(cfg, data_dir=tmp_path / "data") as drv:
        yield drv


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), "64M"], check=True, timeout=30)
    return path


class Dying(Member):
    """A member whose process dies (its connection cut) on receiving request `die_on`."""

    def __init__(self, *args: Any, die_on: str = "", **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.die_on = die_on

    def _answer(self, msg: dict[str, Any]) -> None:
        if msg.get("op") == self.die_on:
            self.link.sock.shutdown(socket.SHUT_RDWR)
            raise LinkError("killed")
        super()._answer(msg)


@dataclass
class Job:
    members: Members
    threads: list[threading.Thread]
    exits: dict[str, int | str] = field(default_factory=dict)
    defined: list[dict[str, Any]] = field(default_factory=list)


def _start(driver: Driver, image: Path, die: dict[str, str] | None = None) -> tuple[Job, JobVMs]:
    """A leader on n1 and member pilots on n2, n3 (threads), joined; the job's VMs not booted."""
    members = Members(NODES[1:], host="127.0.0.1")
    job = Job(members, [])

    def member(node: str) -> None:
        def spec(msg: dict[str, Any], vm: str, _rank: int) -> VMSpec:
            job.defined.append(msg)
            return VMSpec(vm, image)

        try:
            link = member_link.connect(members.address, members.token, node)
            job.exits[node] = Dying(link, driver, node, spec, die_on=(die or {}).get(node, "")).serve()
        except (LinkError, DriverError) as exc:
            job.exits[node] = str(exc)

    for node in NODES[1:]:
        t = threading.Thread(target=member, args=(node,), daemon=True)
        t.start()
        job.threads.append(t)
    members.join(timeout_s=30)
    remotes = members.vms(NAMES[1:], SUBNET, driver, 30)
    vms = JobVMs(driver, "job9", NODES, SUBNET, lambda _r, vm, _n: VMSpec(vm, image), remotes,
                 lambda rank: {"job": {"network": {"ssh_private": f"secret key of rank {rank}"}}})  # fmt: skip
    return job, vms


def _end(job: Job) -> None:
    job.members.close(wait_s=1)
    for t in job.threads:
        t.join(timeout=10)


def _dom_state(driver: Driver, vm: str, node: str) -> int | None:
    try:
        return int(driver.connection(node).lookupByName(vm).state()[0])
    except libvirt.libvirtError:
        return None


def _all_running(driver: Driver) -> bool:
    return all(_dom_state(driver, vm, node) == libvirt.VIR_DOMAIN_RUNNING for vm, node in VMS)


def test_a_cut_and_a_restore_through_two_member_pilots(driver: Driver, image: Path) -> None:
    job, vms = _start(driver, image)
    try:
        vms.boot()
        assert _all_running(driver)
        # each member built its own VM from what the leader sent; the secret arrived sealed and was opened
        assert sorted(d["job"]["network"]["ssh_private"] for d in job.defined) == ["secret key of rank 1",
                                                                                   "secret key of rank 2"]  # fmt: skip
        seen: list[bool] = []
        real_save = MemberVM.save

        def watching(self: MemberVM, **kw: Any) -> Any:  # when any member saves, no VM of the job still runs
            seen.extend(_dom_state(driver, vm, node) != libvirt.VIR_DOMAIN_RUNNING for vm, node in VMS)
            return real_save(self, **kw)

        MemberVM.save = watching  # type: ignore[method-assign]
        try:
            cut = coordinated.checkpoint(driver, vms._coordinated())
        finally:
            MemberVM.save = real_save  # type: ignore[method-assign]
        assert cut.consistent and seen and all(seen)
        assert set(cut.snapshots) == set(NAMES)
        for vm, node in VMS:
            assert driver.state(vm, node) == VMState.SAVED
            on_disk = driver.verify(vm, node)  # a member's SAVED answer: its state's size and sha256
            assert (cut.snapshots[vm].size_bytes, cut.snapshots[vm].sha256) == (on_disk.size_bytes, on_disk.sha256)
        resumed = coordinated.restore(driver, vms._coordinated())
        assert _all_running(driver) and resumed.running_at >= max(resumed.restored_at.values())
        vms.delete()
        assert all(driver.state(vm, node) is None for vm, node in VMS)
    finally:
        _end(job)
    assert job.exits == {"n2": 0, "n3": 0}  # released by `bye`


def test_a_member_killed_between_pause_and_save_rolls_the_cut_back(driver: Driver, image: Path) -> None:
    """n2's member dies on SAVE with its VM paused: the cut fails, the VMs already saved are
    restored, n2's paused VM is let run through the leader's driver; every VM runs again."""
    job, vms = _start(driver, image, die={"n2": "save"})
    try:
        vms.boot()
        with pytest.raises(DriverError, match="job9-1 on node n2: member pilot lost"):
            coordinated.checkpoint(driver, vms._coordinated())
        assert _all_running(driver)
        assert all(driver.state(vm, node) == VMState.RUNNING for vm, node in VMS)
    finally:
        _end(job)
    assert job.exits["n3"] == 0


def test_a_leader_killed_mid_cut_leaves_members_that_save_only_a_paused_vm(driver: Driver, image: Path) -> None:
    """The leader paused n2's VM (not yet n3's) and died: n2's member saves its VM (it is at the
    cut), n3's leaves its VM running. The job's next leader and members finish that cut: n2's
    restored paused, then all run; nothing is booted anew."""
    job, vms = _start(driver, image)
    try:
        vms.boot()
        assert driver.pause(NAMES[0], "n1")
        n2 = vms.members[1]
        assert isinstance(n2, MemberVM) and n2.pause()
        for link in job.members.links.values():  # the leader SIGKILLed: its connections close
            link.sock.shutdown(socket.SHUT_RDWR)
            link.close()
        for t in job.threads:
            t.join(timeout=10)
        assert job.exits == {"n2": 0, "n3": 0}
        assert driver.state(NAMES[1], "n2") == VMState.SAVED
        assert _dom_state(driver, NAMES[2], "n3") == libvirt.VIR_DOMAIN_RUNNING
        assert _dom_state(driver, NAMES[0], "n1") == libvirt.VIR_DOMAIN_PAUSED
    finally:
        _end(job)
    job2, vms2 = _start(driver, image)
    try:
        vms2._spec_factory = lambda *_a: pytest.fail("a job at its cut must not boot")
        assert vms2.active()  # the pilot's first look finishes the cut
        assert _all_running(driver)
    finally:
        _end(job2)


def test_a_connection_without_the_token_is_refused_and_a_member_with_it_joins(driver: Driver) -> None:
    members = Members(["n2"], host="127.0.0.1")
    refused: list[str] = []
    wrong = "0" * 64 if members.token != "0" * 64 else "1" * 64

    def stranger() -> None:
        try:
            member_link.connect(members.address, wrong, "n2")
        except LinkError as exc:
            refused.append(str(exc))

    def impostor() -> None:  # knows the token but claims a node that is not the job's
        try:
            link = member_link.connect(members.address, members.token, "n9")
            link.recv(5)
        except LinkError as exc:
            refused.append(str(exc))

    links: list[member_link.Link] = []
    joiner = threading.Thread(target=members.join, kwargs={"timeout_s": 20})
    joiner.start()
    stranger()
    impostor()
    links.append(member_link.connect(members.address, members.token, "n2"))
    joiner.join(timeout=20)
    try:
        assert len(refused) == 2, refused
        assert set(members.links) == {"n2"} and len(links) == 1
        with pytest.raises(OSError):  # the token is spent: the listener is closed
            socket.create_connection(tuple(members.address.rsplit(":", 1)), timeout=2)  # type: ignore[arg-type]
        # a frame altered on the way fails its HMAC
        link = members.links["n2"]
        body = b'{"op":"pause"}'
        forged = bytes(32) + body
        links[0].sock.sendall(len(forged).to_bytes(4, "big") + forged)
        with pytest.raises(LinkError, match="HMAC"):
            link.recv(5)
    finally:
        for lk in links:
            lk.close()
        members.close(wait_s=1)


def test_a_member_ignores_its_own_sigterm_and_saves_at_its_leaders_word(driver: Driver, image: Path) -> None:
    """Slurm signals every step of a requeued job at once: the member (here in the main thread,
    where its SIGTERM handler lives) gets SIGTERM with its VM running and does not save; it
    still answers its leader's PAUSE and SAVE, and ends at `bye`."""
    members = Members(["n2"], host="127.0.0.1")
    seen: dict[str, Any] = {}

    def leader() -> None:
        try:
            members.join(timeout_s=20)
            vm = members.vms(["job9-1"], SUBNET, driver, 30)[0]
            vm.define({})
            vm.boot()
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
            seen["after_sigterm"] = vm.state()
            seen["paused"] = vm.pause()
            seen["saved"] = vm.save(job_id=None, bypass_cache=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            seen["error"] = exc
        finally:
            members.close(wait_s=1)

    t = threading.Thread(target=leader, daemon=True)
    t.start()
    link = member_link.connect(members.address, members.token, "n2")
    member = Member(link, driver, "n2", lambda _m, vm, _r: VMSpec(vm, image))
    assert member.serve() == 0
    t.join(timeout=10)
    assert "error" not in seen, seen.get("error")
    assert member.terminated.is_set()  # the signal came, and was only noted
    assert seen["after_sigterm"] is VMState.RUNNING and seen["paused"] is True
    assert driver.state("job9-1", "n2") == VMState.SAVED
    assert seen["saved"].sha256 == driver.verify("job9-1", "n2").sha256


def test_vms_left_paused_by_a_pilot_killed_before_any_save_run_again(driver: Driver, image: Path) -> None:
    """Leader mode too: a pilot SIGKILLed after pausing the job's VMs, before saving any, used to
    leave them paused for ever (adopted as running); the next pilot's first look lets them run."""
    vms = JobVMs(driver, "job9", NODES, SUBNET, lambda _r, vm, _n: VMSpec(vm, image))
    vms.boot()
    assert driver.pause(NAMES[0], "n1") and driver.pause(NAMES[2], "n3")
    again = JobVMs(driver, "job9", NODES, SUBNET, lambda *_a: pytest.fail("a live job must not boot"))
    assert again.active()
    assert _all_running(driver)
    again.delete()
