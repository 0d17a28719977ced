"""`vjob db backup` / `vjob db restore` on SQLite and on a real PostgreSQL (the `postgres`
marker): round trips, a backup taken while another process writes, and the refusals."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pwd
import random
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, select, text

from tests.as_user import as_nobody
from vjob.cli import main
from vjob.errors import InputError, UsageError
from vjob.model import Job, JobClass
from vjob.store import identities, jobs, leases, vms
from vjob.store.backup import FORMAT, VJOB_TABLES, backup, restore
from vjob.store.db import VERSION_TABLE, Store, head_revision
from vjob.store.journal import PlannedAction, open_switch
from vjob.store.schema import ActionRecord, SwitchRecord

VJOB = [sys.executable, "-m", "vjob.cli"]


def _fill(store: Store, seed: int = 7) -> None:
    """Rows in most of vjob's tables, drawn from a seeded generator (names with dots, '@',
    quotes: what a backup must carry unchanged)."""
    rng = random.Random(seed)
    users = ["alice.smith", "bob@lab", "o'hara", "żółw"]
    for i in range(40):
        job = Job(
            id=str(1000 + i),
            user=rng.choice(users[:2]) if i % 3 else "carol",
            rms="slurm",
            job_class=rng.choice(list(JobClass)),
            nodes=rng.randint(1, 4),
            cores=rng.randint(1, 32),
            memory_mb=rng.randint(256, 65536),
            submit_time=1.7e9 + rng.random() * 1e5,
        )
        jobs.track(store, job)
        if i % 2:
            jobs.record_preemption(store, "slurm", job.id, at=1.7e9 + i)
            vms.remember(store, "slurm", job, vm=f"vjob-slurm-{job.id}-0", node=f"n{i % 5}", memory_mb=512)
        if i % 4 == 0:
            identities.assign(
                store, site="lyon", job_key=f"slurm:{job.id}", vm_names=[f"v{i}a", f"v{i}b"], mac_prefix="52:54:00"
            )
    actions = [
        PlannedAction(0, "suspend", f"vjob-slurm-{1001 + 2 * k}-0", f"slurm:{1001 + 2 * k}", "n1", None)
        for k in range(3)
    ]
    open_switch(store, "interactive job 1002 arrived", {"why": "test", "user": "bob@lab"}, actions)
    leases.acquire(store, "agent:slurm", "ctl1:4242", 30.0, at=1.7e9)  # long expired


def _rows(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of vjob's tables and its version table, in a stable order."""
    meta = MetaData()
    with store.engine.connect() as conn:
        meta.reflect(bind=conn, only=[*VJOB_TABLES, VERSION_TABLE])
        return {
            name: sorted((tuple(r) for r in conn.execute(select(table))), key=repr)
            for name, table in meta.tables.items()
        }


def test_round_trip(db_url: str, tmp_path: Path) -> None:
    source = Store(db_url)
    source.upgrade()
    _fill(source)
    before = _rows(source)
    assert sum(len(v) for v in before.values()) > 80
    with source.engine.begin() as conn:  # a table that is not vjob's (an Optuna study's, say)
        conn.execute(text("CREATE TABLE studies (study_id INTEGER PRIMARY KEY, study_name TEXT)"))
        conn.execute(text("INSERT INTO studies VALUES (1, 'site1')"))
    result = backup(source, tmp_path / "vjob.backup")
    assert stat.S_IMODE((tmp_path / "vjob.backup").stat().st_mode) == 0o600
    assert result.revision == head_revision()
    assert result.rows["jobs"] == 40
    # Into a fresh store of the same kind: the target of db_url is dropped and made again.
    source.downgrade("base")
    restored = restore(source, tmp_path / "vjob.backup")
    assert restored.rows == result.rows
    assert _rows(source) == before
    assert "studies" not in result.rows and "studies" not in restored.rows
    with source.engine.connect() as conn:  # left alone by the restore's deletes and inserts
        assert conn.execute(text("SELECT study_name FROM studies")).scalars().all() == ["site1"]
    # The next insert takes a new id (PostgreSQL's sequences were moved past the restored ids).
    jobs.track(source, Job(id="9999", user="dave", rms="slurm"))
    source.close()


def test_sqlite_backup_restores_into_another_kind(db_url: str, tmp_path: Path) -> None:
    """A SQLite store's backup restores into PostgreSQL (and a PostgreSQL dump into SQLite)."""
    other = f"sqlite:///{tmp_path / 'other.sqlite'}"
    source, target = Store(other), Store(db_url)
    source.upgrade()
    _fill(source, seed=11)
    backup(source, tmp_path / "a.backup")
    restore(target, tmp_path / "a.backup")
    assert _rows(target) == _rows(source)
    backup(target, tmp_path / "b.backup")
    third = Store(f"sqlite:///{tmp_path / 'third.sqlite'}")
    restore(third, tmp_path / "b.backup")
    assert _rows(third) == _rows(source)
    for s in (source, target, third):
        s.close()


def _writer(url: str, stop: Any, started: Any) -> None:
    """Journal switches of exactly three actions each, one transaction per switch, until told
    to stop: a backup that tears a transaction shows a switch with fewer actions."""
    store = Store(url)
    n = 0
    while not stop.is_set():
        with store.session() as s:
            sw = SwitchRecord(reason=f"w{n}", state="running", plan_json="{}", created_at=n, updated_at=n)
            s.add(sw)
            s.flush()
            for k in range(3):
                s.add(ActionRecord(switch_id=sw.id, pool=0, action="suspend", vm_name=f"vm{n}-{k}", state="planned"))
        n += 1
        if n == 20:
            started.set()
    store.close()


def _switch_count(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT COUNT(*) FROM switches")).scalar_one())


def test_backup_while_another_process_writes(db_url: str, tmp_path: Path) -> None:
    store = Store(db_url)
    store.upgrade()
    _fill(store)
    ctx = mp.get_context("spawn")
    stop, started = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_writer, args=(db_url, stop, started))
    proc.start()
    try:
        assert started.wait(60), "the writer process did not start writing"
        seen = []
        for i in range(4):
            before = _switch_count(store)
            backup(store, tmp_path / f"b{i}")
            after = _switch_count(store)
            seen.append((before, after))
    finally:
        stop.set()
        proc.join(60)
    assert proc.exitcode == 0
    assert seen[-1][1] > seen[0][0], "the writer wrote nothing while the backups ran"
    for i, (before, after) in enumerate(seen):
        copy = Store(f"sqlite:///{tmp_path / f'copy{i}.sqlite'}")
        restore(copy, tmp_path / f"b{i}")
        with copy.engine.connect() as conn:
            torn = conn.execute(
                text(
                    "SELECT s.id, COUNT(a.id) FROM switches s LEFT JOIN actions a ON a.switch_id = s.id "
                    "WHERE s.reason LIKE 'w%' GROUP BY s.id HAVING COUNT(a.id) != 3"
                )
            ).all()
        assert torn == []
        assert before <= _switch_count(copy) <= after
        copy.close()
    store.close()


def test_restore_refusals(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'vjob.sqlite'}"
    store = Store(url)
    store.upgrade()
    _fill(store)
    backup(store, tmp_path / "b")
    # A store that holds rows is not overwritten without force.
    with pytest.raises(UsageError, match="--force"):
        restore(store, tmp_path / "b")
    # ... nor while an agent holds its lease (it would write over the restored state).
    leases.acquire(store, "agent:slurm", "ctl2:99", 30.0)
    with pytest.raises(UsageError, match="agent:slurm is held by ctl2:99"):
        restore(store, tmp_path / "b", force=True)
    leases.release(store, "agent:slurm", "ctl2:99")
    restore(store, tmp_path / "b", force=True)
    # Another schema revision: refused unless told; told, the empty target is migrated to it.
    old = Store(f"sqlite:///{tmp_path / 'old.sqlite'}")
    old.upgrade("0005")
    backup(old, tmp_path / "old.backup")
    fresh = Store(f"sqlite:///{tmp_path / 'fresh.sqlite'}")
    with pytest.raises(UsageError, match="schema 0005"):
        restore(fresh, tmp_path / "old.backup")
    assert fresh.current_revision() is None
    restore(fresh, tmp_path / "old.backup", any_revision=True)
    assert fresh.current_revision() == "0005"
    # A foreign or cut file writes nothing.
    (tmp_path / "junk").write_text("hello\n")
    with pytest.raises(InputError, match="neither a SQLite database nor a vjob dump"):
        restore(fresh, tmp_path / "junk")
    for s in (store, old, fresh):
        s.close()


def test_restore_is_all_or_nothing(tmp_path: Path) -> None:
    """A dump whose last row breaks a constraint leaves the target store as it was."""
    store = Store(f"sqlite:///{tmp_path / 'a.sqlite'}")
    store.upgrade()
    dump = [
        {"format": FORMAT, "version": 1, "revision": head_revision(), "dialect": "postgresql"},
        {"table": "switches", "columns": ["id", "reason", "state", "plan_json", "created_at", "updated_at"]},
        [1, "ok", "done", "{}", 1.0, 1.0],
        [2, "bad", "no-such-state", "{}", 1.0, 1.0],
    ]
    (tmp_path / "d").write_text("".join(json.dumps(x) + "\n" for x in dump))
    with pytest.raises(Exception, match="nothing was written"):
        restore(store, tmp_path / "d")
    assert _switch_count(store) == 0
    store.close()


def test_cli_backup_restore(tmp_path: Path) -> None:
    """The commands as an operator runs them: exit codes, the 0600 file, a refusal on stderr."""
    env = {**os.environ, "VJOB_DATA_DIR": str(tmp_path / "a")}
    run = lambda *a, **kw: subprocess.run([*VJOB, *a], capture_output=True, text=True, env=kw.get("env", env))  # noqa: E731
    assert run("db", "upgrade").returncode == 0
    store = Store(f"sqlite:///{tmp_path / 'a' / 'vjob.sqlite'}")
    _fill(store)
    done = run("db", "backup", str(tmp_path / "b.db"))
    assert done.returncode == 0, done.stderr
    assert f"schema {head_revision()}" in done.stdout
    assert stat.S_IMODE((tmp_path / "b.db").stat().st_mode) == 0o600
    refused = run("db", "restore", str(tmp_path / "b.db"))
    assert refused.returncode == 2 and "--force" in refused.stderr and refused.stdout == ""
    other = {**env, "VJOB_DATA_DIR": str(tmp_path / "b")}
    ok = run("db", "restore", str(tmp_path / "b.db"), env=other)
    assert ok.returncode == 0, ok.stderr
    assert _rows(Store(f"sqlite:///{tmp_path / 'b' / 'vjob.sqlite'}")) == _rows(store)
    bad = run("db", "restore", str(tmp_path / "nothere"), env={**env, "VJOB_DATA_DIR": str(tmp_path / "c")})
    assert bad.returncode == 2 and not (tmp_path / "c" / "vjob.sqlite").exists()
    with sqlite3.connect(tmp_path / "b.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    store.close()


def test_a_user_backs_up_and_restores_their_own_store() -> None:
    """As `nobody`, on its own embedded store: the backup is 0600 and its own, the restore into a
    second store of its own gives the same rows; a backup into a directory it cannot write fails
    with exit 1 and leaves the file there as it was."""
    import vjob.cli.db  # noqa: F401 - loaded here: nobody cannot read this venv

    with tempfile.TemporaryDirectory(prefix="vjob-backup-user-") as where:
        base = Path(where)
        nobody = pwd.getpwnam("nobody")
        os.chown(base, nobody.pw_uid, nobody.pw_gid)
        (base / "root").mkdir(mode=0o755)  # root's, inside nobody's
        foreign = base / "root" / "old.db"

        def work() -> int:
            os.environ.pop("VJOB_CONFIG", None)
            os.environ["VJOB_DATA_DIR"] = str(base / "a")
            store = Store(f"sqlite:///{base / 'a' / 'vjob.sqlite'}")
            store.upgrade()
            _fill(store)
            codes = [main(["db", "backup", str(base / "b.db")])]
            os.environ["VJOB_DATA_DIR"] = str(base / "c")
            codes.append(main(["db", "restore", str(base / "b.db")]))
            other = Store(f"sqlite:///{base / 'c' / 'vjob.sqlite'}")
            codes.append(0 if _rows(other) == _rows(store) else 9)
            codes.append(main(["db", "backup", str(foreign)]))
            return int("".join(map(str, codes)))

        foreign.write_text("root's\n")
        done = as_nobody(work, cwd=base)
        assert done.returncode == 1, done.stderr  # int("0001"): the last backup failed
        assert f"backup {base / 'root'}: cannot write there: Permission denied" in done.stderr
        made = (base / "b.db").stat()
        assert stat.S_IMODE(made.st_mode) == 0o600 and made.st_uid == nobody.pw_uid
        assert foreign.read_text() == "root's\n"
