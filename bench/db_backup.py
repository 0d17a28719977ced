"""`vjob db backup` / `restore`: time and size for a store of N tracked jobs (docs/operator.md).

    nice -n 10 .venv/bin/python bench/db_backup.py --jobs 10000 [--postgres URL]

Each job gets one VM row and every tenth a journalled switch of three actions: about what an
agent keeps for a cluster that saw N jobs. The store is filled with bulk inserts (the agent's
per-job transactions are not what is measured). PostgreSQL: URL of an empty database.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from sqlalchemy import insert

from vjob.store.backup import backup, restore
from vjob.store.db import Store
from vjob.store.schema import ActionRecord, JobRecord, SwitchRecord, VMRecord


def fill(store: Store, jobs: int) -> None:
    t = 1.7e9
    with store.engine.begin() as conn:
        conn.execute(
            insert(JobRecord),
            [
                dict(
                    id=i + 1,
                    rms="slurm",
                    rms_job_id=str(100000 + i),
                    user=f"user{i % 97}",
                    account="lab",
                    created_at=t + i,
                    updated_at=t + i,
                    vjob_state="terminated",
                    preempt_count=i % 3,
                )
                for i in range(jobs)
            ],
        )
        conn.execute(
            insert(VMRecord),
            [
                dict(
                    name=f"vjob-slurm-{100000 + i}-0",
                    job_id=i + 1,
                    node=f"n{i % 512}",
                    image="debian12",
                    memory_mb=2048,
                    state="stopped",
                    created_at=t + i,
                    updated_at=t + i,
                )
                for i in range(jobs)
            ],
        )
        switches = jobs // 10
        conn.execute(
            insert(SwitchRecord),
            [
                dict(id=s + 1, reason="interactive job", state="done", plan_json="{}", created_at=t, updated_at=t)
                for s in range(switches)
            ],
        )
        conn.execute(
            insert(ActionRecord),
            [
                dict(switch_id=s // 3 + 1, pool=0, action="suspend", vm_name=f"vm{s}", state="done")
                for s in range(3 * switches)
            ],
        )


def measure(url: str, target_url: str, out: Path, jobs: int) -> None:
    store = Store(url)
    store.upgrade()
    fill(store, jobs)
    t0 = time.perf_counter()
    result = backup(store, out)
    t1 = time.perf_counter()
    target = Store(target_url)
    restore(target, out)
    t2 = time.perf_counter()
    size = out.stat().st_size / 1e6
    print(
        f"{store.dialect:10} {jobs:7} jobs  {sum(result.rows.values()):7} rows  backup {t1 - t0:6.2f} s  "
        f"{size:6.1f} MB ({result.format})  restore {t2 - t1:6.2f} s"
    )
    store.close()
    target.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--postgres", metavar="URL", default=None, help="an empty PostgreSQL database")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        measure(f"sqlite:///{base / 'a.sqlite'}", f"sqlite:///{base / 'b.sqlite'}", base / "a.backup", args.jobs)
        if args.postgres:
            measure(args.postgres, f"sqlite:///{base / 'c.sqlite'}", base / "p.backup", args.jobs)


if __name__ == "__main__":
    main()
