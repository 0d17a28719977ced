"""Issue 23 item 11: OpenPBS's `execjob_preresume` with the state store down.

The shipped restore command used to be `vjob vm restore`, which opens the store first: with
the database unreachable it failed, the hook refused the resume, and every suspended job stayed
suspended until the database came back. The hook's commands are now `plugins.pbs.hook_vm`,
which restores from the node's state file and manifest and records to the store later.

OpenPBS cannot run here: the hook runs as the MoM would run it against the stand-in `pbs`
module (tests/test_pbs_hook.py). Everything else is real: the shipped command line of
deploy/pbs/vjob_hook.json (with this venv's python and a test configuration), the libvirt
test driver (a node file shared by this process and the hook's command), a SQLite store for
the records, and a PostgreSQL URL nothing listens on for the outage.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from plugins.pbs import hook_vm
from provisioning.driver import Driver, VMSpec
from tests.services.libvirt import make_test_node
from tests.test_pbs_hook import HOOK, Hook
from vjob import config as vconfig
from vjob.errors import InputError
from vjob.model import Job, VMState
from vjob.store import jobs
from vjob.store.db import Store
from vjob.store.schema import SnapshotRecord, VMRecord

pytestmark = pytest.mark.libvirt

JOB = "4243.pbs-server"
VM = f"vjob-pbs-{JOB}"
NODE = socket.gethostname().split(".")[0]  # what the hook's {node} becomes without PBS
UNREACHABLE = "postgresql://vjob@127.0.0.1:9/vjob"  # the discard port: connection refused at once


def _toml(tmp_path: Path, uri: str, database_url: str) -> Path:
    path = tmp_path / f"vjob-{len(list(tmp_path.glob('vjob-*.toml')))}.toml"
    path.write_text(
        f'data_dir = "{tmp_path / "data"}"\n\n[database]\nurl = "{database_url}"\nconnect_timeout_s = 2\n\n'
        f'[provisioning]\nsnapshot_dir = "{tmp_path / "snap" / "{node}"}"\noperation_timeout_s = 30\n\n'
        f'[provisioning.nodes]\n"{NODE}" = "{uri}"\n'
    )
    return path


@pytest.fixture
def base_image(tmp_path: Path) -> Path:
    path = tmp_path / "images" / "base.qcow2"
    path.parent.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), "64M"], check=True, timeout=30)
    return path


def test_a_suspended_job_resumes_with_the_database_down(tmp_path: Path, base_image: Path) -> None:
    uri = make_test_node(tmp_path / "nodes", NODE)
    sqlite_url = f"sqlite:///{tmp_path / 'vjob.sqlite'}"
    store = Store(sqlite_url)
    store.upgrade()
    cfg = vconfig.load(_toml(tmp_path, uri, sqlite_url))
    job_id = jobs.track(store, Job(id=JOB, user="ann", rms="pbs"))
    with Driver(cfg.provisioning, data_dir=cfg.data_path, store=store) as driver:
        driver.define(VMSpec(VM, base_image), NODE, job_id=job_id)
        driver.boot(VM, NODE)
        snap = driver.save(VM, NODE)  # what the postsuspend did while the store was up
    with store.session() as s:
        assert s.scalar(select(VMRecord.state).where(VMRecord.name == VM)) == VMState.SAVED.value

    (tmp_path / "hook").mkdir()
    hook = Hook(tmp_path / "hook")
    shipped = json.loads((HOOK.parents[2] / "deploy" / "pbs" / "vjob_hook.json").read_text())
    assert shipped["restore_command"][:4] == ["/usr/bin/python3", "-I", "-m", "plugins.pbs.hook_vm"]
    down = _toml(tmp_path, uri, UNREACHABLE)
    # The shipped line, with this venv's python (-I kept) and the test configuration.
    hook.config["restore_command"] = [sys.executable, *shipped["restore_command"][1:4], "--config", str(down)]
    hook.config["restore_command"] += shipped["restore_command"][4:]
    hook.config["command_timeout_s"] = 60
    (tmp_path / "hook" / "state").mkdir(mode=0o700)
    (tmp_path / "hook" / "state" / f"{JOB}.saved").write_text("saved\n")  # the postsuspend's marker

    result = hook.run("EXECJOB_PRERESUME", {"id": JOB, "queue": "workq", "interactive": None})
    assert result["outcome"] == "accept", result
    assert "store unreachable: recorded once it is back" in str(result["log"])
    assert not (tmp_path / "hook" / "state" / f"{JOB}.saved").exists()
    assert not snap.memory_path.exists()  # restored: the stale memory state is gone
    pending = sorted((cfg.data_path / hook_vm.PENDING_DIR).glob("*.json"))
    assert len(pending) == 1 and pending[0].stat().st_mode & 0o777 == 0o600
    with store.session() as s:  # the store has not been told yet
        assert s.scalar(select(VMRecord.state).where(VMRecord.name == VM)) == VMState.SAVED.value

    # The database is back: the next hook command (here `flush`) writes what was kept.
    done = subprocess.run(
        [sys.executable, "-m", "plugins.pbs.hook_vm", "--config", str(_toml(tmp_path, uri, sqlite_url)), "flush"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and "1 pending record(s)" in done.stdout, done.stderr
    with store.session() as s:
        vm = s.scalar(select(VMRecord).where(VMRecord.name == VM))
        assert vm is not None and (vm.state, vm.node) == (VMState.RUNNING.value, NODE)
        assert s.scalar(select(SnapshotRecord).where(SnapshotRecord.path == str(snap.memory_path))) is None
    assert list((cfg.data_path / hook_vm.PENDING_DIR).glob("*")) == []
    store.close()


def test_a_store_that_answers_with_the_wrong_schema_is_not_an_outage(tmp_path: Path) -> None:
    """An empty database answers: writing through it would corrupt it, so the command fails
    (a missing SQLite file would be created at the schema; an existing empty one is not)."""
    (tmp_path / "e.db").touch()
    cfg = vconfig.load(_toml(tmp_path, make_test_node(tmp_path / "nodes", NODE), f"sqlite:///{tmp_path / 'e.db'}"))
    with pytest.raises(Exception, match="no vjob schema"):
        hook_vm.run(cfg, "restore", VM, NODE)


@pytest.mark.parametrize(
    "vm", ["vjob-pbs-12.s\n", "vjob-pbs-../../etc", "vjob-slurm-12", "vjob-pbs--rf", "vjob-pbs-12 --node x"]
)
def test_hostile_vm_names_are_refused(vm: str) -> None:
    with pytest.raises(InputError, match="vm = "):
        hook_vm.check_vm(vm)
    assert hook_vm.main(["--config", "/nonexistent.toml", "restore", vm, "--node", NODE]) == 2


def test_a_planted_pending_record_is_set_aside(tmp_path: Path) -> None:
    """Pending records live in root's 0700 directory; one that is not ours is not applied."""
    cfg = vconfig.load(_toml(tmp_path, make_test_node(tmp_path / "nodes", NODE), f"sqlite:///{tmp_path / 'f.db'}"))
    store = Store(cfg.database_url)
    store.upgrade()
    bad = hook_vm.pending_dir(cfg) / "00000000000000000000-x.json"
    bad.write_text(json.dumps({"op": "restored", "vm": "../x", "node": NODE, "state_path": "/etc/passwd"}))
    assert hook_vm.flush(cfg, store) == 0 and bad.with_suffix(".bad").exists()
    store.close()
