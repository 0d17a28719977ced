"""Per-node pilots' protocol on libvirt's test driver (pilot.members.leader, pilot.members.member).

The leader and its member pilots talk over real TCP with the real handshake; the members run
as threads here (test-driver domains live in one process), each driving its own node's VM.
A member "killed" is one whose connection is cut at the named moment, as the kernel does for a
SIGKILLed process. The real launch by srun is test_multinode_slurm.py's per-node case.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libvirt
import pytest
from pydantic import ValidationError

from pilot.members import link as member_link
from pilot.members import workdir as member_workdir
from pilot.members.leader import Members, MemberVM, leader_address
from pilot.members.link import LinkError
from pilot.members.member import Member
from pilot.multinode import JobVMs
from pilot.pilot import Pilot
from pilot.settings import PilotSettings
from plugins.member_launch import LEADER_ENV, TOKEN_ENV
from provisioning import coordinated, job_disk
from provisioning.driver import Driver, DriverError, VMSpec
from provisioning.job_disk import JobDescription
from tests.services.libvirt import make_test_node
from vjob.config import AgentConfig, ProvisioningConfig
from vjob.errors import VjobError
from vjob.model import VMState
from vjob.pilot_files import PilotDir, PilotState

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
    built_from: dict[str, Path | None] = field(default_factory=dict)
    """Per member node, the directory it built its job disk from (None: the leader sent it)."""


def _start(
    driver: Driver,
    image: Path,
    die: dict[str, str] | None = None,
    *,
    workdir: Path | None = None,
    member_dirs: dict[str, Path | None] | None = None,
    leader_spec: Any = None,
    member_spec: Any = None,
) -> tuple[Job, JobVMs]:
    """A leader on n1 and member pilots on n2, n3 (threads), joined; the job's VMs not booted.
    `workdir`: the leader's working directory (a member's is the same unless `member_dirs` says)."""
    members = Members(NODES[1:], host="127.0.0.1")
    job = Job(members, [])
    work = workdir or image.parent / "work"  # the test's tmp_path
    work.mkdir(exist_ok=True)

    def member(node: str) -> None:
        def spec(msg: dict[str, Any], vm: str, rank: int, wd: Path | None) -> VMSpec:
            job.defined.append(msg)
            job.built_from[node] = wd
            return member_spec(msg, vm, rank, wd, node) if member_spec else VMSpec(vm, image)

        try:
            link = member_link.connect(members.address, members.token, node)
            mine = (member_dirs or {}).get(node, work)
            job.exits[node] = Dying(link, driver, node, spec, mine, die_on=(die or {}).get(node, "")).serve()
        except (LinkError, DriverError) as exc:
            job.exits[node] = str(exc)

    for node in NODES[1:]:
        t = threading.Thread(target=member, args=(node,), daemon=True)
        t.start()
        job.threads.append(t)
    members.join(timeout_s=30)
    remotes = members.vms(NAMES[1:], SUBNET, driver, 30)

    def describe(rank: int) -> dict[str, Any]:
        return {"job": {"cwd": str(work), "network": {"ssh_private": f"secret key of rank {rank}"}}}

    vms = JobVMs(
        driver, "job9", NODES, SUBNET, leader_spec or (lambda _r, vm, _n: VMSpec(vm, image)), remotes, describe
    )
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
        assert sorted(d["job"]["network"]["ssh_private"] for d in job.defined) == [
            "secret key of rank 1",
            "secret key of rank 2",
        ]
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


def test_a_member_ignores_its_own_sigterm_and_saves_at_its_leaders_word(
    driver: Driver, image: Path, tmp_path: Path
) -> None:
    """Slurm signals every step of a requeued job at once: the member (here in the main thread,
    where its SIGTERM handler lives) gets SIGTERM with its VM running and does not save; it
    still answers its leader's PAUSE and SAVE, and ends at `bye`."""
    members = Members(["n2"], host="127.0.0.1")
    seen: dict[str, Any] = {}

    def leader() -> None:
        try:
            members.join(timeout_s=20)
            vm = members.vms(["job9-1"], SUBNET, driver, 30)[0]
            vm.define({"job": {"cwd": str(tmp_path)}})
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
    member = Member(link, driver, "n2", lambda _m, vm, _r, _w: VMSpec(vm, image), tmp_path)
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


def _job_disks(driver: Driver, image: Path, work: Path) -> tuple[Any, Any]:
    """Spec builders that make real job disks (mkfs.ext4 -d, qemu-img): the leader's for any
    rank (as the leader mode builds them), a member's from the directory it was given."""

    def description(rank: int, cwd: Path) -> JobDescription:
        return JobDescription(
            script=b"#!/bin/sh\ntrue\n",
            args=[],
            env={},
            uid=0,
            gid=0,
            user="root",
            home="/root",
            cwd=str(cwd),
            hostname=f"vm{rank}",
        )

    def build(wd: Path, rank: int, vm: str, node: str) -> VMSpec:
        disk = driver.job_disk_path(vm, node)
        disk.parent.mkdir(parents=True, exist_ok=True)
        job_disk.build(wd, description(rank, work), disk, limit_bytes=1 << 20, free_bytes=64 << 20)
        return VMSpec(vm, image, job_disk=disk)

    def leader(rank: int, vm: str, node: str) -> VMSpec:
        return build(work, rank, vm, node)

    def member(_msg: dict[str, Any], vm: str, rank: int, wd: Path | None, node: str) -> VMSpec:
        return (
            build(wd, rank, vm, node) if wd is not None else VMSpec(vm, image, job_disk=driver.job_disk_path(vm, node))
        )

    return leader, member


def _files_on(disk: Path, scratch: Path) -> dict[str, str]:
    """The working directory's copy on a job disk (/work), read with debugfs as the pilot reads it."""
    raw = scratch.with_suffix(".raw")
    subprocess.run(["qemu-img", "convert", "-q", "-U", "-O", "raw", str(disk), str(raw)], check=True, timeout=60)
    debugfs = shutil.which("debugfs") or "/usr/sbin/debugfs"

    def ask(request: str) -> str:
        run = subprocess.run([debugfs, "-R", request, str(raw)], capture_output=True, text=True, timeout=60)
        return run.stdout

    names = [f.split("/")[5] for f in ask("ls -p /work").splitlines() if f.count("/") >= 6]
    return {n: ask(f"cat /work/{n}") for n in names if n not in (".", "..")}


def test_a_member_without_the_working_directory_gets_its_job_disk_from_the_leader(
    driver: Driver, image: Path, tmp_path: Path
) -> None:
    """No shared filesystem: n2's member has no such directory (srun would have started it in
    /tmp), n3's shares the leader's. n2's does not see the leader's probe and gets the job disk
    the leader builds from its own directory, checked on arrival; n3's builds its own; the probe
    is gone before any disk is built, so no disk holds it."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("the leader's files\n")
    leader, member = _job_disks(driver, image, work)
    job, vms = _start(
        driver,
        image,
        workdir=work,
        member_dirs={"n2": tmp_path / "missing", "n3": work},
        leader_spec=leader,
        member_spec=member,
    )
    try:
        vms.boot()
        assert _all_running(driver)
        assert job.built_from == {"n2": None, "n3": work}
        for vm, node in VMS:
            files = _files_on(driver.job_disk_path(vm, node), tmp_path / f"out-{node}")
            assert files == {"data.txt": "the leader's files\n"}, (node, files)  # no probe on any disk
        assert [p.name for p in work.iterdir()] == ["data.txt"]
    finally:
        _end(job)


def test_a_job_disk_altered_on_the_way_is_refused_by_the_member(
    driver: Driver, image: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("x\n")
    leader, member = _job_disks(driver, image, work)
    real = Driver.place_job_disk

    def altered(self: Driver, vm: str, node: str) -> dict[str, Any]:
        built = real(self, vm, node)
        with open(self.job_disk_path(vm, node), "r+b") as fh:  # one byte changed after the check at the source
            fh.seek(100)
            byte = fh.read(1)
            fh.seek(100)
            fh.write(bytes([byte[0] ^ 0xFF]))
        return built

    monkeypatch.setattr(Driver, "place_job_disk", altered)
    job, vms = _start(driver, image, workdir=work, member_dirs={"n2": None}, leader_spec=leader, member_spec=member)
    try:
        with pytest.raises(
            DriverError,
            match=r"job9-1 on node n2: the member refused: the job disk the leader sent is "
            r"refused \(.*corrupt.*\); removed here",
        ):
            vms.boot()
        assert not driver.job_disk_path("job9-1", "n2").exists()
        assert driver.state("job9-1", "n2") is None
        assert "n2" not in job.built_from  # nothing defined from a bad disk
    finally:
        _end(job)


def test_the_leader_listens_where_its_route_toward_the_members_leaves(driver: Driver) -> None:
    """Not its host name's address (127.0.0.1 here, 127.0.1.1 on Debian): the source address
    the kernel picks toward the first member node, or `[agent] member_address`."""
    out = subprocess.run(["ip", "-o", "route", "get", "203.0.113.5"], capture_output=True, text=True, check=False)
    if out.returncode == 0 and " src " in out.stdout:  # a machine with a route out: the kernel's answer
        assert leader_address("203.0.113.5") == out.stdout.split(" src ")[1].split()[0]
    assert leader_address("127.0.0.1") == "127.0.0.1"
    assert Members(["127.0.0.1"]).address.startswith("127.0.0.1:")
    assert leader_address("no-such-node.invalid") == socket.gethostbyname(socket.gethostname())  # the fallback
    with pytest.raises(VjobError, match=r"cannot listen on 203\.0\.113\.7 \(\[agent\] member_address"):
        Members(["n2"], host="203.0.113.7")  # not an address of this machine
    with pytest.raises(ValidationError, match="member_address"):
        AgentConfig(member_address="eth0")
    assert AgentConfig(member_address="::1").member_address == "::1"
    members = Members(["n2"], host="::1")  # IPv6: the member parses [addr]:port
    assert members.address.startswith("[::1]:")
    joiner = threading.Thread(target=members.join, kwargs={"timeout_s": 20})
    joiner.start()
    link = member_link.connect(members.address, members.token, "n2")
    joiner.join(timeout=20)
    try:
        assert set(members.links) == {"n2"}
    finally:
        link.close()
        members.close(wait_s=1)


MEMBER_PROCESS = """
import os
import sys
from pathlib import Path
from pilot.members import link as member_link
from pilot.members import workdir as member_workdir
from pilot.members.member import Member
from plugins.member_launch import LEADER_ENV, TOKEN_ENV
from provisioning.driver import Driver, VMSpec
from vjob.config import ProvisioningConfig

uri, snap, data, image, workdir = sys.argv[1:6]
cfg = ProvisioningConfig(nodes={"n2": uri}, snapshot_dir=snap, operation_timeout_s=30)
link = member_link.connect(os.environ[LEADER_ENV], os.environ[TOKEN_ENV], "n2")
with Driver(cfg, data_dir=Path(data)) as drv:
    member = Member(link, drv, "n2", lambda _m, vm, _r, _w: VMSpec(vm, Path(image)), Path(workdir))
    code = member.serve()
print("sigterm seen:", member.terminated.is_set(), flush=True)
sys.exit(code)
"""


def _sigterm_alone(driver: Driver, image: Path, tmp_path: Path, job: str, per_node: bool) -> dict[str, Any]:
    """A 2-node pilot (n1, n2) that gets SIGTERM with no request first — a requeue or preemption
    as Slurm does it, signalling every step of the job at once: with `per_node`, n2's VM is a
    member pilot's, a real process of its own (its own test-driver instance of n2) that gets
    SIGTERM too and must ignore it. Returns what happened and the cut's times."""
    work = tmp_path / f"work-{job}"
    work.mkdir()
    nodes, names = ["n1", "n2"], [f"{job}-0", f"{job}-1"]
    members, proc, remotes = None, None, []
    if per_node:
        members = Members(["n2"], host="127.0.0.1")
        env = {**os.environ, TOKEN_ENV: members.token, LEADER_ENV: members.address}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                MEMBER_PROCESS,
                driver.uri("n2"),
                str(tmp_path / "snap" / "{node}"),
                str(tmp_path / "data"),
                str(image),
                str(work),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=Path(__file__).parent.parent,
        )
        try:
            members.join(timeout_s=60)
        except VjobError:
            proc.kill()
            raise AssertionError(
                f"the member process never joined: {proc.communicate(timeout=10)[0][-3000:]}"
            ) from None
        remotes = members.vms(names[1:], SUBNET, driver, 30)
    vms = JobVMs(
        driver,
        job,
        nodes,
        SUBNET,
        lambda _r, vm, _n: VMSpec(vm, image),
        remotes,
        lambda _rank: {"job": {"cwd": str(work)}},
    )
    pdir = PilotDir(tmp_path / "pilots", "slurm", job.removeprefix("job"))
    settings = PilotSettings(rms="slurm", job_id=job.removeprefix("job"), node="n1", poll_s=0.05)
    pilot = Pilot(settings, pdir, vms, out=io.StringIO(), err=io.StringIO())  # type: ignore[arg-type]
    cuts: list[coordinated.Cut] = []
    real_checkpoint = coordinated.checkpoint
    sent: dict[str, float] = {}

    def recording(*a: Any, **kw: Any) -> coordinated.Cut:
        cuts.append(real_checkpoint(*a, **kw))
        return cuts[-1]

    def requeue() -> None:  # the RMS: SIGTERM to every step of the job at once, once the job runs
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st = pdir.read_state()
            if st is not None and st.state is PilotState.RUNNING:
                break
            time.sleep(0.02)
        sent["at"] = time.monotonic()
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)

    coordinated.checkpoint = recording  # type: ignore[assignment]
    rms = threading.Thread(target=requeue, daemon=True)
    rms.start()
    try:
        code = pilot.run()
        exited = time.monotonic()
    finally:
        coordinated.checkpoint = real_checkpoint  # type: ignore[assignment]
        rms.join(timeout=5)
        member_out = ""
        if members is not None and proc is not None:
            members.close(wait_s=10)
            member_out = proc.communicate(timeout=10)[0]
    state = pdir.read_state()
    return {
        "code": code,
        "state": state.state if state else None,
        "cuts": cuts,
        "member_exit": proc.returncode if proc else None,
        "member_out": member_out,
        "sigterm_to_exit_s": exited - sent["at"],
        "saved": [driver.verify(vm, node).sha256 for vm, node in zip(names, nodes, strict=True)],
    }


def test_sigterm_alone_finishes_the_cut_through_a_member_that_ignores_its_own(
    driver: Driver, image: Path, tmp_path: Path
) -> None:
    """SIGTERM → PAUSE → all paused → SAVE → all saved, with no request from the agent first.
    The member process got the same SIGTERM, noted it, and still paused and saved at its
    leader's word, then ended at `bye`. The leader mode is run the same way for comparison: the
    figures (test driver: no guest memory to write, so the protocol's own cost) are printed."""
    per_node = _sigterm_alone(driver, image, tmp_path, "job7", per_node=True)
    leader = _sigterm_alone(driver, image, tmp_path, "job8", per_node=False)
    for run in (per_node, leader):
        assert run["code"] == 0 and run["state"] is PilotState.SAVED, run
        assert len(run["cuts"]) == 1 and run["cuts"][0].consistent, run["cuts"]
        assert len(run["saved"]) == 2  # both states verify on disk (size and sha256 of their manifests)
    assert per_node["member_exit"] == 0, per_node["member_out"]
    assert "sigterm seen: True" in per_node["member_out"], per_node["member_out"]
    figures = {
        "figure": "member_sigterm_cut",
        "per_node_pause_to_saved_s": round(per_node["cuts"][0].pause_to_saved_s, 4),
        "leader_pause_to_saved_s": round(leader["cuts"][0].pause_to_saved_s, 4),
        "per_node_sigterm_to_exit_s": round(per_node["sigterm_to_exit_s"], 4),
        "leader_sigterm_to_exit_s": round(leader["sigterm_to_exit_s"], 4),
    }
    print(json.dumps(figures))


def test_the_working_directory_probe_follows_no_symlink(tmp_path: Path) -> None:
    """A member never takes a symlink planted where the probe should be (or a linked directory)
    for the leader's directory; the leader makes no probe through a linked directory."""
    work = tmp_path / "work"
    work.mkdir()
    probe = member_workdir.leave_probe(str(work))
    assert probe is not None
    try:
        assert member_workdir.sees_probe(work, str(work), probe.name, probe.nonce) == (True, "")
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "copy").write_text(probe.nonce)
        (elsewhere / probe.name).symlink_to(elsewhere / "copy")  # the right content, behind a link
        same, why = member_workdir.sees_probe(elsewhere, str(elsewhere), probe.name, probe.nonce)
        assert not same and "not a regular file" not in why  # refused at open (O_NOFOLLOW)
        link = tmp_path / "link"
        link.symlink_to(work)  # the right directory, through a link
        assert member_workdir.sees_probe(link, str(link), probe.name, probe.nonce)[0] is False
        assert member_workdir.sees_probe(work, "/elsewhere", probe.name, probe.nonce)[0] is False
        assert member_workdir.sees_probe(work, str(work), "../x", probe.nonce)[0] is False
        assert member_workdir.leave_probe(str(link)) is None
    finally:
        probe.remove()
    assert list(work.iterdir()) == []
