"""The Torque submit filter's deadline check, run as qsub runs it (the script on stdin, qsub's
arguments as argv): a job whose x-factor is at or over the X the agent publishes is refused
with x, X and why; without a usable threshold file, a deadline or a walltime, it is accepted
and tagged as any job. Each fail-open case has its control: the same job refused by a fresh
file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from preemption.deadline.threshold_file import read_threshold, write_threshold
from tests.test_pbs_submit_filter import run_filter


def _config(tmp_path: Path, threshold: Path | None) -> Path:
    path = tmp_path / "vjob.toml"
    deadline = f'[deadline]\nthreshold_file = "{threshold}"\n' if threshold else ""
    path.write_text(f'[pbs]\nos_images = ["centos7"]\nfilter_budget_s = 5\n{deadline}')
    return path


def _script(deadline: float | str | None, walltime: str | None = "1:00:00") -> bytes:
    lines = ["#!/bin/sh"]
    if walltime is not None:
        lines.append(f"#PBS -l nodes=1:ppn=4,walltime={walltime}")
    if deadline is not None:
        value = deadline if isinstance(deadline, str) else str(int(deadline))
        lines.append(f"#PBS -v A=1,VJOB_DEADLINE={value}")
    return ("\n".join([*lines, "hostname", ""])).encode()


@pytest.fixture
def threshold(tmp_path: Path) -> Path:
    path = tmp_path / "vjob-deadline.threshold"
    write_threshold(path, 0.2, 1.1, time.time())
    return path


@pytest.mark.parametrize(("walltime", "minutes"), [("1:00:00", 60), ("3600", 60), ("60:00", 60), ("90:00", 90)])
def test_a_job_over_X_is_refused_with_x_X_and_why(tmp_path: Path, threshold: Path, walltime: str, minutes: int) -> None:
    now = time.time()
    done = run_filter(_script(now + 1800, walltime), config=_config(tmp_path, threshold))
    remaining = minutes * 1.1
    x = (remaining - 30) / remaining
    assert done.returncode == 1 and done.stdout == b""
    said = done.stderr.decode()
    assert said.startswith("qsub: job rejected by vjob: the job cannot be expected to meet its deadline: ")
    assert (
        f"x = {x:.2f} >= X = 0.20 (time limit {minutes} min x VM slowdown 1.10 = {remaining:.0f} min to run, "
        "deadline in 30 min); ask for a later deadline or a shorter time limit\n"
    ) in said


def test_qsub_arguments_override_the_script(tmp_path: Path, threshold: Path) -> None:
    now = time.time()
    cfg = _config(tmp_path, threshold)
    # the script asks 60 min, qsub -l 10 min: 11 min to run in 30, accepted
    assert run_filter(_script(now + 1800), "-l", "walltime=10:00", config=cfg).returncode == 0
    # the script has no deadline, qsub -v gives one: refused
    refused = run_filter(_script(None), "-v", f"VJOB_DEADLINE={int(now + 1800)}", config=cfg)
    assert refused.returncode == 1 and b"x = 0.55 >= X = 0.20" in refused.stderr


@pytest.mark.parametrize(
    "case", ["missing", "corrupt", "stale", "future", "unconfigured", "no-deadline", "hostile-deadline", "no-walltime"]
)
def test_without_a_usable_threshold_deadline_or_walltime_the_job_is_accepted_and_tagged(
    tmp_path: Path, threshold: Path, case: str
) -> None:
    now = time.time()
    late = _script(now + 1800)
    refused = run_filter(late, config=_config(tmp_path, threshold))
    assert refused.returncode == 1  # the control: this file refuses this job
    script, cfg = late, _config(tmp_path, threshold)
    if case == "missing":
        threshold.unlink()
    elif case == "corrupt":
        threshold.write_bytes(b"x=banana slowdown=\xff at=yesterday\n")
    elif case in ("stale", "future"):
        write_threshold(threshold, 0.0, 1.1, now + (3600 if case == "future" else -3600))
    elif case == "unconfigured":
        cfg = _config(tmp_path, None)
    elif case == "no-deadline":
        script = _script(None)
    elif case == "hostile-deadline":
        script = _script("$(reboot)")
    else:
        script = _script(now + 1800, walltime=None)
    if case in ("missing", "corrupt", "stale", "future"):
        assert read_threshold(threshold, now=time.time()) is None  # the agent's reader agrees
    done = run_filter(script, config=cfg)
    assert done.returncode == 0, done.stderr
    assert b"VJOB_CLASS=batch" in done.stdout and done.stdout.endswith(b"\nhostname\n")  # tagged, passed on


def test_the_staleness_limit_comes_from_the_file(tmp_path: Path, threshold: Path) -> None:
    now = time.time()
    cfg = _config(tmp_path, threshold)
    write_threshold(threshold, 0.0, 1.1, now - 3600, stale_after_s=7200)  # an hour old, stale after two: used
    assert run_filter(_script(now + 1800), config=cfg).returncode == 1
    write_threshold(threshold, 0.0, 1.1, now - 120, stale_after_s=60)  # two minutes old, stale after one
    assert run_filter(_script(now + 1800), config=cfg).returncode == 0
