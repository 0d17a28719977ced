"""The OpenPBS queuejob hook's deadline check, run as PBS runs it against the recorded-behaviour
stand-in `pbs` module of tests/pbs_standins.py (OpenPBS itself cannot run here, docs/pbs.md):
the same threshold file, rules and message as job_submit.lua, failing open."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from plugins.pbs.convert import Conventions, to_job
from preemption.deadline.threshold_file import THRESHOLD_NAME, read_threshold, write_threshold
from tests.test_pbs_hook import Hook


@pytest.fixture
def hook(tmp_path: Path) -> Hook:
    h = Hook(tmp_path)
    h.config["deadline_threshold_file"] = str(tmp_path / THRESHOLD_NAME)
    return h


def _job(deadline: float | None, walltime: str | None = "01:00:00") -> dict[str, Any]:
    variables = {"PBS_O_HOME": "/home/ann"}
    if deadline is not None:
        variables["VJOB_DEADLINE"] = str(int(deadline))
    return {
        "id": "12.pbs-01",
        "queue": "workq",
        "interactive": None,
        "Variable_List": variables,
        "Resource_List": {"walltime": walltime} if walltime else {},
    }


def test_a_job_that_cannot_meet_its_deadline_is_refused_with_the_slurm_message(hook: Hook) -> None:
    now = time.time()
    write_threshold(hook.config["deadline_threshold_file"], 0.2, 1.1, now)
    # 60 min × 1.1 = 66 min to run, 30 min left: x = (66 − 30) / 66 = 0.55 >= 0.2
    result = hook.run("QUEUEJOB", _job(now + 1800))
    assert result["outcome"] == "reject"
    assert result["message"].startswith(
        "vjob: refused: the job cannot be expected to meet its deadline: x = 0.55 >= X = 0.20 "
        "(time limit 60 min x VM slowdown 1.10 = 66 min to run, deadline in 30 min); "
        "ask for a later deadline or a shorter time limit"
    )
    # two hours left: x < 0, accepted and tagged as usual
    ok = hook.run("QUEUEJOB", _job(now + 7200))
    assert ok["outcome"] == "accept" and ok["Variable_List"]["VJOB_CLASS"] == "batch"
    # walltime in seconds or M:S is read the same way: 3600 s
    assert hook.run("QUEUEJOB", _job(now + 1800, walltime="3600"))["outcome"] == "reject"
    assert hook.run("QUEUEJOB", _job(now + 1800, walltime="60:00"))["outcome"] == "reject"


@pytest.mark.parametrize(
    "case", ["missing", "corrupt", "stale", "future", "no deadline", "bad deadline", "no walltime", "off"]
)
def test_the_hook_accepts_when_it_cannot_check(hook: Hook, case: str) -> None:
    path = Path(hook.config["deadline_threshold_file"])
    now = time.time()
    write_threshold(path, 0.0, 1.1, now)
    job = _job(now + 60)
    if case == "missing":
        path.unlink()
    elif case == "corrupt":
        path.write_bytes(b"x=banana slowdown=\xff at=yesterday\n")
    elif case == "stale":
        write_threshold(path, 0.0, 1.1, now - 3600)
    elif case == "future":
        write_threshold(path, 0.0, 1.1, now + 3600)
    elif case == "no deadline":
        job = _job(None)
    elif case == "bad deadline":
        job["Variable_List"]["VJOB_DEADLINE"] = "$(reboot)"
    elif case == "no walltime":
        job = _job(now + 60, walltime=None)
    elif case == "off":
        hook.config["deadline_threshold_file"] = ""
    assert hook.run("QUEUEJOB", job)["outcome"] == "accept"
    # the control: the same job with a fresh X = 0 file is refused (x ≈ 0.98)
    if case not in ("no deadline", "bad deadline", "no walltime", "off"):
        write_threshold(path, 0.0, 1.1, now)
        assert hook.run("QUEUEJOB", job)["outcome"] == "reject"


def test_the_staleness_limit_comes_from_the_file(hook: Hook) -> None:
    """The agent writes its [deadline] stale_after_s into the file; the hook follows it."""
    path = Path(hook.config["deadline_threshold_file"])
    now = time.time()
    write_threshold(path, 0.0, 1.1, now - 3600, stale_after_s=7200)  # an hour old, stale after two
    assert read_threshold(path, now=now) is not None
    assert hook.run("QUEUEJOB", _job(now + 60))["outcome"] == "reject"
    write_threshold(path, 0.0, 1.1, now - 120, stale_after_s=60)  # two minutes old, stale after one
    assert read_threshold(path, now=now) is None
    assert hook.run("QUEUEJOB", _job(now + 60))["outcome"] == "accept"


@pytest.mark.parametrize(("given", "expected"), [("1764100000", 1764100000.0), ("$(reboot)", None), ("", None)])
def test_the_pbs_adapter_reads_the_deadline_the_hook_checked(given: str, expected: float | None) -> None:
    """`VJOB_DEADLINE` reaches Job.deadline (the agent's continuation check, `vjob status`)."""
    record = {
        "Job_Id": "12.pbs-01",
        "Job_Owner": "ann@pbs-01",
        "job_state": "Q",
        "Variable_List": {"PBS_O_HOME": "/home/ann", "VJOB_DEADLINE": given},
    }
    assert to_job(record, Conventions(), source="test").deadline == expected
