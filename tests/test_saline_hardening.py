"""Saline against hostile users and odd OAR answers (issue 23 items 5, 8, 12).

* Forged rows in the shared store never make the root manager touch anything outside its
  repository (a real directory outside survives).
* Users reach the manager only through its socket; the kernel names the caller (SO_PEERCRED),
  so a user running the real CLI as `nobody` cannot cancel root's vjob or submit as root.
* Two managers on one store resubmit a killed vjob exactly once (lease), and a dead
  manager's lease expires so another takes over.
* A garbled OAR answer or an unknown user fails that vjob only, with backoff, then marks it
  failed; the other vjobs go on.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from saline_bew import journal, lease, protocol, server
from saline_bew.manager import Manager
from saline_bew.repository import Repository, RepositoryError
from tests.as_user import as_nobody
from tests.saline_env import FakeOar, make_image, manager_on, new_job, stand_in_manager
from vjob.store.db import Store
from vjob.store.schema import SalineJobRecord

pytestmark = pytest.mark.libvirt


@pytest.fixture
def oar() -> Iterator[FakeOar]:
    with FakeOar() as fake:
        yield fake


@pytest.fixture
def manager(tmp_path: Path, test_nodes: dict[str, str], oar: FakeOar) -> Iterator[Manager]:
    with stand_in_manager(tmp_path, test_nodes, oar, failure_backoff_s=0.0, max_failures=3) as m:
        yield m


def _forge(store: Store, key: str, **values: object) -> None:
    """Rewrite a row as someone holding the store's credentials could."""
    with store.session() as s:
        s.execute(update(SalineJobRecord).where(SalineJobRecord.key == key).values(**values))


# -- item 5a: forged rows --------------------------------------------------------------------
def test_a_forged_key_never_makes_the_manager_delete_outside_the_repository(manager: Manager, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("data")
    repo = manager.ports.sites["a"].repository
    repo.root.mkdir(parents=True, exist_ok=True)
    new_job(manager.ports.store, "be0000000001", phase="cancelled")
    new_job(manager.ports.store, "be0000000002", phase="killed")
    with manager.ports.store.session() as s:  # the journal refuses such a key, so write it by hand
        rec = s.get(SalineJobRecord, "be0000000001")
        columns = {c.key: getattr(rec, c.key) for c in SalineJobRecord.__table__.columns}
        s.add(SalineJobRecord(**{**columns, "key": "../victim"}))
    _forge(manager.ports.store, "be0000000002", snapshot_label="../../victim", snapshot_site="a")
    manager.step()
    manager.step()
    assert (victim / "precious").read_text() == "data"
    assert "../victim" in manager.refused and "does not match" in manager.refused["../victim"]
    assert "be0000000002" in manager.refused and "snapshot_label" in manager.refused["be0000000002"]
    assert journal.events(manager.ports.store, "be0000000002")[-1].kind == "test", "a refused row is never acted on"


def test_the_repository_refuses_bad_keys_and_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("data")
    repo = Repository("a", str(tmp_path / "repo"))
    repo.root.mkdir()
    for key in ("../outside", "be0000000001\n", "be0000000001/..", ""):
        with pytest.raises(RepositoryError, match="refused"):
            repo.remove_job(key)
    (repo.root / "be0000000001").symlink_to(outside)
    with pytest.raises(RepositoryError, match="not a plain directory"):
        repo.remove_job("be0000000001")
    with pytest.raises(RepositoryError, match="not a plain directory"):
        repo.label_dir("be0000000001", "s1")
    with pytest.raises(RepositoryError, match="refused"):
        repo.remove_label("be0000000002", "../../outside")
    assert (outside / "precious").read_text() == "data"


# -- item 5b: the socket ------------------------------------------------------------------
@pytest.fixture
def sock(manager: Manager) -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="vjob-saline-sock-"))
    os.chmod(where, 0o755)  # reachable by `nobody`, writable by root only
    path = where / "saline.sock"
    with server.Server(manager, path):
        yield path
    where.rmdir()


def _as_nobody(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI (`vjob.cli.main`) as `nobody` (tests.as_user), in the socket's directory
    (`nobody` may read it: a submission stages it; only the socket is there, skipped): the
    kernel, not the client, tells the manager who calls."""

    def cli() -> int:
        from vjob.cli import main

        return main(["besteffort", "--socket", str(path), *args])

    return as_nobody(cli, cwd=path.parent)


def test_users_act_only_on_their_own_vjobs_through_the_socket(manager: Manager, sock: Path) -> None:
    assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o666
    new_job(manager.ports.store, "be00000000aa", user="root")
    new_job(manager.ports.store, "be00000000bb", user="nobody")

    refused = _as_nobody(sock, "cancel", "be00000000aa")
    assert refused.returncode == 2, refused.stderr
    assert "belongs to another user" in refused.stderr
    assert journal.get(manager.ports.store, "be00000000aa").phase == "submitted"

    shown = _as_nobody(sock, "show", "be00000000aa")
    assert shown.returncode == 2 and "belongs to another user" in shown.stderr

    listed = _as_nobody(sock, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [j["key"] for j in json.loads(listed.stdout)] == ["be00000000bb"]

    as_root = _as_nobody(sock, "submit", "--user", "root", "--image", "empty", "--", "true")
    assert as_root.returncode == 2 and "only root may submit for another user" in as_root.stderr
    assert len(journal.all_jobs(manager.ports.store)) == 2, "nothing recorded for a refused submission"

    mine = _as_nobody(sock, "cancel", "be00000000bb")
    assert mine.returncode == 0, mine.stderr
    assert journal.get(manager.ports.store, "be00000000bb").phase == "cancelled"


def test_a_user_submission_is_recorded_under_the_kernels_name(manager: Manager, sock: Path, oar: FakeOar) -> None:
    out = _as_nobody(sock, "submit", "--image", "empty", "--", "sleep", "5")
    assert out.returncode == 0, out.stderr
    key = out.stdout.split()[0]
    job = journal.get(manager.ports.store, key)
    assert job.user == "nobody" and job.oar_job_id == "101" and job.command == ("sleep", "5")
    assert len(oar.submitted) == 1


def test_bad_requests_get_an_answer_and_the_server_goes_on(manager: Manager, sock: Path) -> None:
    def raw(data: bytes) -> dict[str, object]:
        with socket.socket(socket.AF_UNIX) as c:
            c.settimeout(20)
            c.connect(str(sock))
            c.sendall(data)
            c.shutdown(socket.SHUT_WR)
            return json.loads(c.makefile("rb").readline())

    assert raw(b"{oops\n")["error"].startswith("request: not a JSON object")
    assert "op" in raw(b'{"op": "reboot"}\n')["error"]
    assert "extra" in raw(b'{"op": "list", "sql": "drop table"}\n')["error"].lower()
    assert "key" in raw(b'{"op": "cancel", "key": "../victim"}\n')["error"]
    assert "key" in raw(b'{"op": "cancel", "key": "be0000000001\\n"}\n')["error"]
    assert "vms" in raw(b'{"op": "submit", "image": "x", "command": ["a"], "vms": "2"}\n')["error"]
    assert "one line" in raw(b"x" * (protocol.MAX_LINE + 10))["error"]
    assert raw(b'{"op": "list"}\n') == {"ok": True, "result": []}


def test_the_socket_directory_must_be_roots_alone(manager: Manager, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(Exception, match="not writable by others"):
        server.Server(manager, shared / "saline.sock").start()
    taken = tmp_path / "taken"
    taken.mkdir(mode=0o755)
    (taken / "saline.sock").write_text("not a socket")
    with pytest.raises(Exception, match="something else is there"):
        server.Server(manager, taken / "saline.sock").start()


# -- item 8: two managers, one store ----------------------------------------------------------
def test_two_managers_resubmit_a_killed_vjob_exactly_once(
    db_url: str, tmp_path: Path, test_nodes: dict[str, str]
) -> None:
    stores = [Store(db_url), Store(db_url)]
    stores[0].upgrade()
    make_image(stores[0], tmp_path)
    with FakeOar(delay_s=0.3) as oar:  # slow OAR: both managers are inside one pass at once
        new_job(stores[0], "be0000000001", oar_job_id="1")
        oar.killed("1", "nobody")
        with (
            manager_on(stores[0], tmp_path / "m1", test_nodes, oar.url) as one,
            manager_on(stores[1], tmp_path / "m2", test_nodes, oar.url) as two,
        ):
            barrier = threading.Barrier(2)
            errors: list[BaseException] = []

            def run(m: Manager) -> None:
                try:
                    barrier.wait()
                    m.step()
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=run, args=(m,)) for m in (one, two)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not errors
            assert len(oar.submitted) == 1, "one kill, one resubmission"
            job = journal.get(stores[0], "be0000000001")
            assert job.kills == 1 and job.oar_job_id == "101"
            holder = lease.holder(stores[0], job.key)[0]
            assert holder in (one.ports.owner, two.ports.owner)
            alive, standby = (one, two) if holder == one.ports.owner else (two, one)

            # The holder dies (stops renewing); the standby waits for the expiry, then acts.
            oar.killed("101", "nobody")
            standby.step()
            assert len(oar.submitted) == 1, "the lease is still the dead manager's"
            standby.ports.clock = lambda: time.time() + alive.ports.lease_s + 1
            standby.step()
            assert len(oar.submitted) == 2 and lease.holder(stores[0], job.key)[0] == standby.ports.owner
            assert journal.get(stores[0], job.key).kills == 2
    for s in stores:
        s.close()


def test_a_manager_that_lost_its_lease_changes_nothing(manager: Manager) -> None:
    new_job(manager.ports.store, "be0000000001")
    assert manager.ports.lease("be0000000001")
    assert lease.acquire(
        manager.ports.store, "be0000000001", "other", now=time.time() + manager.ports.lease_s + 1, ttl_s=60
    )
    with pytest.raises(journal.LeaseLost):
        manager.ports.record("be0000000001", "killed", phase="killed")
    assert journal.get(manager.ports.store, "be0000000001").phase == "submitted"


# -- item 12: poison pills --------------------------------------------------------------------
def test_a_garbled_oar_answer_fails_that_vjob_only(manager: Manager, oar: FakeOar) -> None:
    new_job(manager.ports.store, "be0000000001", oar_job_id="1")
    new_job(manager.ports.store, "be0000000002", oar_job_id="2")
    oar.jobs["1"] = {"id": "1", "state": ["Running"], "owner": "nobody"}  # a list where a word goes
    oar.killed("2", "nobody")
    manager.step()  # must not raise
    assert manager.failures == {"be0000000001": 1}
    assert journal.get(manager.ports.store, "be0000000002").kills == 1, "the healthy vjob went on"
    bad = journal.events(manager.ports.store, "be0000000001")[-1]
    assert bad.kind == "step_failed" and "state" in bad.detail["error"]
    oar.jobs["1"] = b"\x00\xff not json at all"
    manager.step()
    manager.step()
    job = journal.get(manager.ports.store, "be0000000001")
    assert job.phase == "failed" and "3 times in a row" in job.error
    manager.step()  # a failed vjob is not tried again
    assert manager.failures["be0000000001"] == 3


def test_failures_back_off_and_survive_a_restart(manager: Manager, oar: FakeOar) -> None:
    new_job(manager.ports.store, "be0000000001", oar_job_id="1")
    oar.jobs["1"] = {"id": "1", "state": "Running", "owner": "nobody", "events": "nope"}
    manager.failure_backoff_s = 3600
    manager.step()
    manager.step()  # within the backoff: not tried again
    assert [e.kind for e in journal.events(manager.ports.store, "be0000000001")].count("step_failed") == 1
    manager.ports.clock = lambda: time.time() + 3601
    manager.step()
    assert [e.kind for e in journal.events(manager.ports.store, "be0000000001")].count("step_failed") == 2


def test_an_unknown_user_fails_that_vjob_only(manager: Manager, tmp_path: Path) -> None:
    from plugins.oar.client import OarCommands

    empty = tmp_path / "no-oar-here"
    empty.mkdir()
    manager.ports.sites["a"].client = OarCommands(str(empty), timeout_s=5)
    new_job(manager.ports.store, "be0000000001", user="nosuchuser42", phase="killed")
    manager.step()
    ev = journal.events(manager.ports.store, "be0000000001")[-1]
    assert ev.kind == "step_failed" and "nosuchuser42" in ev.detail["error"] and "no such user" in ev.detail["error"]


def test_an_unreachable_oar_or_node_is_retried_not_counted() -> None:
    from plugins.oar.client import OarUnavailable
    from provisioning.driver import DriverError
    from saline_bew.manager import unavailable
    from vjob.errors import CommandError

    assert unavailable(OarUnavailable(["GET x"], "OAR API unreachable"))
    assert unavailable(DriverError("connection", "-", "n9", "Failed to connect socket"))
    assert not unavailable(DriverError("boot", "be0000000001-vm0", "n1", "no such image"))
    assert not unavailable(CommandError(["oarsub"], "exit 1: refused"))
    assert not unavailable(KeyError("x"))
