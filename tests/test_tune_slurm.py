"""`vjob tune run --submit slurm --array 4` on the real development cluster, study in PostgreSQL:
the four array tasks finish the study together, no trial lost, none run twice."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from devkit.devcluster import DevCluster
from tests.conftest import TESTS
from vjob.cli import main

LUBLIN = TESTS / "data" / "traces" / "lublin_256.swf"


def _queued(cluster: DevCluster, job: str) -> bool:
    out = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%i %T"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **cluster.env},
        check=False,
    )
    return bool(out.stdout.strip())


@pytest.mark.slurm
@pytest.mark.postgres
def test_array_tasks_finish_a_study_together(
    slurm_cluster: DevCluster, postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "vjob.toml"
    cfg.write_text(f'data_dir = "{tmp_path}"\n\n[slurm]\nconf = "{slurm_cluster.conf}"\n')
    argv = [
        "--config",
        str(cfg),
        "tune",
        "run",
        "--trace",
        str(LUBLIN),
        "--nodes",
        "256",
        "--max-jobs",
        "1500",
        "--interactive-frac",
        "0.2",
        "--interactive-mean-size",
        "30",
        "--trials",
        "12",
        "--study",
        "array",
        "--storage",
        postgres_url,
        "--submit",
        "slurm",
        "--array",
        "4",
        "--log-dir",
        str(tmp_path / "logs"),
        "--heartbeat-s",
        "5",
    ]
    capsys.readouterr()
    assert main(argv) == 0
    job = capsys.readouterr().out.strip()
    assert job.isdigit()
    deadline = time.monotonic() + 600
    while _queued(slurm_cluster, job) and time.monotonic() < deadline:
        time.sleep(2)
    assert not _queued(slurm_cluster, job), f"array job {job} still queued after 10 minutes"

    trials = optuna.load_study(study_name="array", storage=postgres_url).trials
    assert sum(t.state == TrialState.COMPLETE for t in trials) >= 12
    assert [t.number for t in trials] == list(range(len(trials)))
    assert all(t.state == TrialState.COMPLETE for t in trials), [(t.number, t.state) for t in trials]
    ran: dict[int, list[int]] = {}
    for task in range(4):
        log = tmp_path / "logs" / f"vjob-tune-{job}_{task}.out"
        last = [line for line in log.read_text().splitlines() if line.startswith("{")][-1]
        ran[task] = json.loads(last)["ran"]
    numbers = [n for r in ran.values() for n in r]
    assert sorted(numbers) == [t.number for t in trials]  # each trial run by exactly one task
    workers = {t.user_attrs["worker"].rsplit(":task", 1)[1] for t in trials}
    assert workers == {str(task) for task, r in ran.items() if r} and len(workers) >= 2
