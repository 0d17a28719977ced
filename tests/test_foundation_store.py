"""The state store on SQLite and PostgreSQL: migrations, schema guard, atomic counters."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from vjob.errors import ExhaustedError, SchemaOutdatedError, SchemaTooNewError, StoreError
from vjob.model import Job
from vjob.store import identities, jobs
from vjob.store.db import VERSION_TABLE, Store, head_revision
from vjob.store.schema import Base

TABLES = {
    "jobs",
    "vms",
    "snapshots",
    "os_images",
    "node_images",
    "usage",
    "targets",
    "subnets",
    "vm_ids",
    "switches",
    "actions",
}


def test_upgrade_from_empty_and_downgrade_to_base(db_url: str) -> None:
    s = Store(db_url)
    assert s.current_revision() is None
    s.upgrade()
    assert s.current_revision() == head_revision()
    assert TABLES <= set(inspect(s.engine).get_table_names())
    s.downgrade("base")
    assert s.current_revision() is None
    assert not (TABLES & set(inspect(s.engine).get_table_names()))
    s.upgrade()  # and back up again: downgrade left nothing behind that blocks it
    assert s.check() == head_revision()
    s.close()


def test_models_and_migrations_agree(store: Store) -> None:
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []


def test_empty_database_says_run_upgrade(db_url: str) -> None:
    with pytest.raises(SchemaOutdatedError, match="vjob db upgrade"):
        Store(db_url).check()


def test_older_schema_says_run_upgrade(store: Store) -> None:
    store.downgrade("-1")  # one revision back: whatever the head is, the database is now older
    with pytest.raises(SchemaOutdatedError, match="vjob db upgrade"):
        store.check()


def test_newer_schema_is_refused(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE vjob_alembic_version SET version_num = 'ffff_from_the_future'"))
    with pytest.raises(SchemaTooNewError, match="newer than this vjob knows"):
        store.check()


def test_unreachable_database_is_a_clear_error() -> None:
    s = Store("postgresql+psycopg://vjob:pw@127.0.0.1:1/vjob", connect_timeout_s=2)
    with pytest.raises(StoreError, match="unreachable"):
        s.check()
    with pytest.raises(StoreError, match="unreachable"):
        s.upgrade()


def test_track_is_idempotent(store: Store) -> None:
    job = Job(id="42", user="alice", rms="slurm")
    assert jobs.track(store, job) == jobs.track(store, job)


def test_preempt_and_resume_count_once(store: Store) -> None:
    jobs.track(store, Job(id="42", user="alice", rms="slurm"))
    jobs.record_preemption(store, "slurm", "42", at=100.0)
    jobs.record_preemption(store, "slurm", "42", at=110.0)  # repeated after a crash: no double count
    jobs.record_resume(store, "slurm", "42", at=160.0)
    jobs.record_resume(store, "slurm", "42", at=170.0)
    row = jobs.get(store, "slurm", "42")
    assert row is not None
    assert (row.preempt_count, row.preempted_seconds, row.preempted_since) == (1, 60.0, None)


def test_preempting_an_untracked_job_is_an_error(store: Store) -> None:
    with pytest.raises(Exception, match="not tracked"):
        jobs.record_preemption(store, "slurm", "nope")


# -- concurrency with real processes ------------------------------------------------------
WORKERS = 4
ROUNDS = 40


def _count(url: str, rounds: int) -> None:
    s = Store(url)
    for _ in range(rounds):  # every worker preempts at 0 and resumes at 1.5: each cycle adds 1.5
        jobs.record_preemption(s, "slurm", "7", at=0.0)
        jobs.record_resume(s, "slurm", "7", at=1.5)
    s.close()


def _allocate(url: str, worker: int, count: int, out: mp.Queue) -> None:
    s = Store(url)
    got = [_subnet_of(s, f"site{worker}", f"job-{worker}-{i}") for i in range(count)]
    got.append(_subnet_of(s, f"site{worker}", "shared-job"))
    s.close()
    out.put(got)


def _subnet_of(s: Store, site: str, job_key: str) -> int:
    """The subnetID `assign` gives the job (one VM, named after it)."""
    return identities.assign(s, site=site, job_key=job_key, vm_names=[f"{job_key}-vm"], mac_prefix="52:54:00")[
        0
    ].subnet_id


def _run(target, args_list) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args) for args in args_list]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, f"worker exited with {p.exitcode}"


def test_counters_are_atomic_across_processes(store: Store) -> None:
    jobs.track(store, Job(id="7", user="bob", rms="slurm"))
    _run(_count, [(store.url, ROUNDS)] * WORKERS)
    row = jobs.get(store, "slurm", "7")
    assert row is not None
    # Racing workers skip a preemption already counted, but no update is lost: each counted
    # preemption added its 1.5 s exactly once, and the last resume stopped the clock.
    assert ROUNDS <= row.preempt_count <= WORKERS * ROUNDS
    assert row.preempted_seconds == pytest.approx(row.preempt_count * 1.5)
    assert row.preempted_since is None


def test_subnet_allocation_never_collides_across_processes(store: Store) -> None:
    queue: mp.Queue = mp.get_context("spawn").Queue()
    per_worker = 15
    _run(_allocate, [(store.url, w, per_worker, queue) for w in range(WORKERS)])
    results = [queue.get(timeout=10) for _ in range(WORKERS)]
    private = [sid for r in results for sid in r[:-1]]
    assert len(private) == len(set(private)) == WORKERS * per_worker
    shared = {r[-1] for r in results}
    assert len(shared) == 1 and shared.isdisjoint(private)  # one id for the one job, whoever asked


def test_vm_ids_exhaust_with_a_clear_error(store: Store) -> None:
    names = [f"vm{i}" for i in range(254)]
    got = identities.assign(store, site="site1", job_key="big-job", vm_names=names, mac_prefix="52:54:00")
    sid = got[0].subnet_id
    assert sorted(a.vm_id for a in got) == list(range(1, 255))
    with pytest.raises(ExhaustedError, match=f"subnet {sid}"):
        identities.assign(
            store, site="site1", job_key="big-job", vm_names=[*names, "one-too-many"], mac_prefix="52:54:00"
        )
    identities.release(store, "big-job")
    assert _subnet_of(store, "site1", "next-job") == sid  # freed and reused


def test_sqlite_directory_is_created(tmp_path: Path) -> None:
    s = Store(f"sqlite:///{tmp_path / 'a' / 'b' / 'vjob.sqlite'}")
    s.upgrade()
    assert (tmp_path / "a" / "b" / "vjob.sqlite").exists()
