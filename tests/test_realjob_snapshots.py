"""Every snapshot in the store (issue 15 item 6): the agent records the pilots' saves.

A pilot has no store credentials, so before this its checkpoints never reached `snapshots`.
The pilot's state file is the job user's: only the path the driver would use for the job's own
VM is believed, and what is recorded (size, mtime, sha256) comes from the file itself.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.loop import Agent
from agent.pilot_snapshots import USER_SNAPSHOT_DIR, record_pilot_snapshots
from agent.status_cmd import collect
from plugins.slurm.adapter import SlurmAdapter
from provisioning import integrity
from tests import local_users
from vjob.config import Config, parse
from vjob.model import Job, JobState
from vjob.pilot_files import PilotState, PilotStatus, vm_name
from vjob.store import snapshots as store_snapshots
from vjob.store.db import Store

USER = "vjsnap"
"""A real account, created when missing (as tests/test_realjob_slurm.py does), that only these
tests use: they write into, and move, its home's snapshot directory."""


@pytest.fixture
def cfg(store: Store, tmp_path: Path) -> Config:
    return parse(
        {
            "data_dir": str(tmp_path / "data"),
            "database": {"url": store.url},
            "provisioning": {"snapshot_dir": str(tmp_path / "snaps" / "{node}")},
            "agent": {"pilot_dir": str(tmp_path / "pilots")},
        }
    )


@pytest.fixture
def agent(cfg: Config) -> Agent:
    return Agent(cfg, SlurmAdapter(), rms="slurm")


def _job(job_id: str = "42", user: str = "alice") -> Job:
    return Job(id=job_id, user=user, rms="slurm", state=JobState.HELD)


def _pilot(job: Job, memory_path: Path | str, node: str = "node1") -> PilotStatus:
    return PilotStatus(
        job_id=job.id,
        vm=vm_name("slurm", job.id),
        node=node,
        uri="qemu:///system",
        state=PilotState.SAVED,
        since=time.time(),
        memory_path=str(memory_path),
        saved_node=node,
    )


def _root_state(tmp_path: Path, job: Job, node: str = "node1", data: bytes = b"QEMU state " * 1000) -> Path:
    path = tmp_path / "snaps" / node / f"{vm_name('slurm', job.id)}.state"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_root_pilots_save_is_recorded_once_and_again_when_replaced(
    agent: Agent, store: Store, tmp_path: Path
) -> None:
    job = _job()
    path = _root_state(tmp_path, job)
    _manifest(path, vm_name("slurm", job.id), path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    pilots = {job.id: _pilot(job, path)}
    assert record_pilot_snapshots(agent.ports, store, [job], pilots) == 1
    (row,) = store_snapshots.listing(store)
    assert (row.job, row.vm, row.kind, row.node, row.path) == ("42", "vjob-slurm-42", "memory", "node1", str(path))
    assert row.size_bytes == path.stat().st_size and row.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert row.created_at == path.stat().st_mtime
    assert record_pilot_snapshots(agent.ports, store, [job], pilots) == 0  # unchanged: not hashed again
    path.write_bytes(b"a later save")
    _manifest(path, vm_name("slurm", job.id), path.stat().st_size, hashlib.sha256(b"a later save").hexdigest())
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert record_pilot_snapshots(agent.ports, store, [job], pilots) == 1
    (row,) = store_snapshots.listing(store)
    assert row.sha256 == hashlib.sha256(b"a later save").hexdigest()


@pytest.fixture
def user_home_state() -> Iterator[tuple[Job, Path]]:
    """A user pilot's state in the user's own snapshot dir (its session libvirt's files)."""
    pw = local_users.ensure(USER)
    job = _job(f"snap{uuid.uuid4().hex[:8]}", USER)
    directory = Path(pw.pw_dir) / USER_SNAPSHOT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{vm_name('slurm', job.id)}.state"
    path.write_bytes(b"user's QEMU state")
    os.chown(path, pw.pw_uid, pw.pw_gid)
    yield job, path
    path.unlink(missing_ok=True)


def test_a_user_pilots_save_in_its_home_is_recorded(
    agent: Agent, store: Store, user_home_state: tuple[Job, Path]
) -> None:
    job, path = user_home_state
    assert record_pilot_snapshots(agent.ports, store, [job], {job.id: _pilot(job, path)}) == 1
    (row,) = store_snapshots.listing(store)
    assert row.path == str(path) and row.sha256 == "-"  # the user's file: never hashed by root (issue 39)


@pytest.mark.timeout(120)  # a FIFO opened blocking would hang the agent: fail, not wait 900 s
def test_hostile_claims_are_not_recorded(agent: Agent, store: Store, tmp_path: Path) -> None:
    """Every claim below names a file the agent must not hash or record for this job."""
    job, other = _job("42"), _job("43")
    other_state = _root_state(tmp_path, other)
    secret = tmp_path / "secret"
    secret.write_text("root's secret")
    cases: list[tuple[str, Path | str]] = [
        ("a file elsewhere", secret),
        ("another job's VM", other_state),
        ("a relative path", f"snaps/node1/{vm_name('slurm', '42')}.state"),
        ("dot-dot out of the dir", tmp_path / "snaps" / "node1" / ".." / ".." / "secret"),
    ]
    for _, claim in cases:
        assert record_pilot_snapshots(agent.ports, store, [job], {job.id: _pilot(job, claim)}) == 0
    expected = tmp_path / "snaps" / "node1" / f"{vm_name('slurm', '42')}.state"
    expected.parent.mkdir(parents=True, exist_ok=True)
    expected.symlink_to(secret)  # the expected name, but a link to a file the job may not read
    assert record_pilot_snapshots(agent.ports, store, [job], {job.id: _pilot(job, expected)}) == 0
    expected.unlink()
    os.mkfifo(expected)  # a FIFO would block a reading agent forever: the test's timeout bounds that
    assert record_pilot_snapshots(agent.ports, store, [job], {job.id: _pilot(job, expected)}) == 0
    expected.unlink()
    expected.write_bytes(b"state")
    os.chown(expected, 12345, 12345)  # neither root nor the job's user
    assert record_pilot_snapshots(agent.ports, store, [job], {job.id: _pilot(job, expected)}) == 0
    assert store_snapshots.listing(store) == []


def test_a_symlinked_directory_under_the_users_home_is_refused(
    agent: Agent, store: Store, user_home_state: tuple[Job, Path], tmp_path: Path
) -> None:
    """The user controls everything below their home: a linked snapshot dir is not followed."""
    job, path = user_home_state
    snapshots = path.parent
    moved = tmp_path / "elsewhere"
    shutil.move(str(snapshots), moved)
    try:
        snapshots.symlink_to(moved)
        assert record_pilot_snapshots(agent.ports, store, [job], {job.id: _pilot(job, path)}) == 0
        assert store_snapshots.listing(store) == []
    finally:
        snapshots.unlink(missing_ok=True)
        shutil.move(str(moved), snapshots)


def test_vjob_status_lists_the_snapshots(agent: Agent, cfg: Config, store: Store, tmp_path: Path) -> None:
    job = _job()
    record_pilot_snapshots(agent.ports, store, [job], {job.id: _pilot(job, _root_state(tmp_path, job))})
    data = collect(cfg, "slurm")
    assert [(s["job"], s["vm"], s["kind"], s["node"]) for s in data["snapshots"]] == [
        ("42", "vjob-slurm-42", "memory", "node1")
    ]
    assert collect(cfg, "pbs")["snapshots"] == []


# -- issue 39, item 4: the tick hashes nothing a user wrote ---------------------------------------
def _manifest(path: Path, vm: str, size: int, digest: str) -> Path:
    """The save-time manifest the VM driver writes beside a state (provisioning.integrity)."""
    integrity.write_manifest(
        path,
        {"vm": vm, "node": "node1", "kind": "memory", "size_bytes": size, "sha256": digest, "created_at": time.time()},
    )
    return integrity.manifest_path(path)


def test_a_root_save_is_recorded_with_the_digest_root_took_at_save_time(
    agent: Agent, store: Store, tmp_path: Path
) -> None:
    """The digest comes from root's own manifest, written when libvirt saved the VM: the agent
    does not read the state again (it used to hash up to 64 GiB inside its tick)."""
    job = _job()
    path = _root_state(tmp_path, job)
    at_save = "ab" * 32  # not the content's digest: proves the content was not read
    _manifest(path, vm_name("slurm", job.id), path.stat().st_size, at_save)
    assert record_pilot_snapshots(agent.ports, store, [job], {job.id: _pilot(job, path)}) == 1
    (row,) = store_snapshots.listing(store)
    assert row.sha256 == at_save and row.size_bytes == path.stat().st_size


@pytest.mark.parametrize("problem", ["other size", "other VM", "user's manifest", "no manifest", "not hex"])
def test_a_digest_root_did_not_take_is_not_recorded(agent: Agent, store: Store, tmp_path: Path, problem: str) -> None:
    """A manifest that does not describe this file as root saved it gives no digest: "-"."""
    job = _job()
    path = _root_state(tmp_path, job)
    size, vm, digest = path.stat().st_size, vm_name("slurm", job.id), "cd" * 32
    if problem != "no manifest":
        manifest = _manifest(
            path,
            "vjob-slurm-43" if problem == "other VM" else vm,
            size + 1 if problem == "other size" else size,
            "zz" * 32 if problem == "not hex" else digest,
        )
        if problem == "user's manifest":
            os.chown(manifest, 12345, 12345)
    assert record_pilot_snapshots(agent.ports, store, [job], {job.id: _pilot(job, path)}) == 1
    (row,) = store_snapshots.listing(store)
    assert row.sha256 == "-" and row.size_bytes == size


def test_a_users_own_state_is_recorded_but_never_hashed(
    agent: Agent, store: Store, user_home_state: tuple[Job, Path]
) -> None:
    """The user wrote it (and its manifest): the agent records where and how big, not a digest
    it would have to compute from the user's file on the user's schedule."""
    job, path = user_home_state
    manifest = _manifest(path, vm_name("slurm", job.id), path.stat().st_size, "ef" * 32)
    pw = pwd.getpwnam(USER)
    os.chown(manifest, pw.pw_uid, pw.pw_gid)
    try:
        assert record_pilot_snapshots(agent.ports, store, [job], {job.id: _pilot(job, path)}) == 1
        (row,) = store_snapshots.listing(store)
        assert row.path == str(path) and row.sha256 == "-" and row.size_bytes == path.stat().st_size
    finally:
        manifest.unlink()
