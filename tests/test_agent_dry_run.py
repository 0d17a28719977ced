"""`vjob agent --dry-run` on the real Slurm development cluster (issue 22, item 4).

A full cluster of batch vjobs (their pilots stand in as state files: no VM is needed to be
chosen as a victim) and a pending interactive `srun`: a dry-run tick must report the victims it
would checkpoint and change nothing — no requeue, no priority sent, no lease, no job tracked.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.services import wait_for
from vjob.config import parse
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, pilot_root
from vjob.store.db import Store

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]


def _show(env: dict[str, str], job: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def test_a_dry_run_tick_reports_victims_and_changes_nothing(slurm_cluster, tmp_path: Path) -> None:
    env = slurm_cluster.env
    data = tmp_path / "data"
    db = data / "vjob.db"
    cfg_path = tmp_path / "vjob.toml"
    cfg_path.write_text(
        f'data_dir = "{data}"\n[database]\nurl = "sqlite:///{db}"\n'
        f'[slurm]\nconf = "{slurm_cluster.conf}"\n'
        "[priority]\ninteractive_cap = 0.5\n"
        '[logging]\nformat = "json"\nlevel = "info"\n'
    )
    cfg = parse({"data_dir": str(data), "database": {"url": f"sqlite:///{db}"}})
    store = Store(cfg.database_url)
    store.upgrade()
    batch: list[str] = []
    srun = None
    try:
        for _ in range(4):  # 4 x 2 nodes: the 8-node cluster is full
            batch.append(
                subprocess.run(
                    ["sbatch", "--parsable", "-N2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 600"],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=True,
                ).stdout.strip()
            )
        # The cluster is shared with other tests: wait for their jobs to end.
        wait_for(lambda: all(_show(env, j)["JobState"] == "RUNNING" for j in batch), 600, "the batch jobs running")
        root = pilot_root(cfg)
        for job in batch:
            node = _show(env, job)["BatchHost"]
            pdir = PilotDir(root, "slurm", job)
            pdir.ensure()
            pdir.write_state(
                PilotStatus(
                    job_id=job,
                    vm=pdir.vm,
                    node=node,
                    uri="test:///default",
                    state=PilotState.RUNNING,
                    since=time.time(),
                )
            )
        srun = subprocess.Popen(
            ["srun", "-N2", "--exclusive", "/bin/true"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

        def interactive() -> str | None:
            out = subprocess.run(
                ["squeue", "-h", "-t", "PD", "-o", "%i"],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            return next((j for j in out.split() if "interactive" in _show(env, j).get("AdminComment", "")), None)

        wait_for(lambda: interactive() is not None, 30, "the interactive srun pending")
        inter = interactive()
        assert inter is not None
        before = {j: _show(env, j) for j in [*batch, inter]}

        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "vjob.cli",
                "agent",
                "--dry-run",
                "--once",
                "--rms",
                "slurm",
                "--config",
                str(cfg_path),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        events = [json.loads(line) for line in (r.stdout + r.stderr).splitlines() if line.startswith("{")]
        would = [e for e in events if e.get("event") == "dry run: would do"]
        assert len(would) == 1, r.stdout + r.stderr
        pre = would[0]["preemptions"]
        assert [p["job"] for p in pre] == [inter]
        assert pre[0]["victims"] and set(pre[0]["victims"]) <= set(batch)
        assert inter in {str(k) for k in would[0]["priorities"]}

        after = {j: _show(env, j) for j in [*batch, inter]}
        for job in batch:
            assert after[job]["JobState"] == "RUNNING" and after[job]["Restarts"] == before[job]["Restarts"]
            assert not PilotDir(root, "slurm", job).request_file.exists(), "no checkpoint requested"
        assert after[inter]["JobState"] == "PENDING"
        for job in [*batch, inter]:
            assert after[job]["Priority"] == before[job]["Priority"], f"priority of {job} changed"
        with store.engine.connect() as conn:
            for table in ("leases", "jobs", "switches", "usage"):
                assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() == 0, table
    finally:
        if srun is not None:
            srun.kill()
            srun.wait(timeout=30)
        subprocess.run(["scancel", *batch], env=env, capture_output=True, timeout=30, check=False)
        store.close()
