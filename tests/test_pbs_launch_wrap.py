"""Every job of a queue is a vjob on PBS (issue 33, item 6): OpenPBS's hook and Torque's filter.

PBS cannot run on this machine (no OpenPBS or Torque packages for Debian 12): these tests run
the OpenPBS hook as PBS runs it, against the stand-in `pbs` module (tests/pbs_standins.py) that
presents one event and records what the hook did, and Torque's SUBMITFILTER as qsub runs it.
What the hook and the filter produce is then executed for real: the launch line and the
wrapper by /bin/sh, with a stand-in `vjob` that records its arguments, directory and stdin.

OpenPBS: the queuejob hook gives a batch job naming no image its queue's image
(`vjob_queues`); `-v VJOB_OS=off` (`#PBS -v VJOB_OS=off` in the script: the server never sees
the script) opts out where `allow_opt_out`, and is refused where not. The execjob_launch hook
replaces the top shell by `vjob run --rms pbs --os IMAGE --script - --` in $PBS_O_WORKDIR; the
MoM hands the script to the top shell on stdin (OpenPBS src/resmom/start_exec.c, `script_in`),
so the stand-in here gets it the same way. Torque: `#VJOB off` in the script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plugins.pbs.convert import Conventions, job_os
from tests.test_pbs_hook import HOOK, Hook, _job
from tests.test_realjob_pbs_wrap import VJOB_STANDIN, _payload, run_filter

SCRIPT = b'#!/bin/bash\n#PBS -N plain\n#PBS -l select=1:ncpus=2\necho "it\'s `id`" $HOME\nexit 3\n'


def run_event(hook: Hook, event: dict[str, Any]) -> dict[str, Any]:
    """Hook.run with the launch event's progname, argv and env (what the MoM is about to start)."""
    config = hook.dir / "vjob_hook.json"
    config.write_text(json.dumps(hook.config))
    spec = hook.dir / "event.json"
    spec.write_text(json.dumps({**event, "config": str(config)}))
    result = hook.dir / "result.json"
    result.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(hook.dir), "PBS_STANDIN_EVENT": str(spec), "PBS_STANDIN_RESULT": str(result)}
    done = subprocess.run([sys.executable, str(HOOK)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(result.read_text())


@pytest.fixture
def marked(tmp_path: Path) -> Hook:
    hook = Hook(tmp_path)
    hook.config.update(vjob_queues={"workq": "debian12"}, allow_opt_out=False)
    return hook


def queued(hook: Hook, **job: Any) -> dict[str, Any]:
    return run_event(hook, {"type": "QUEUEJOB", "job": _job(**job)})


# -- OpenPBS queuejob: the queue's default image ------------------------------------------------


def test_a_batch_job_of_a_vjob_queue_gets_its_image_and_others_do_not(marked: Hook) -> None:
    got = queued(marked)
    assert got["outcome"] == "accept" and got["Variable_List"]["VJOB_OS"] == "debian12"
    assert "VJOB_OS" not in queued(marked, queue="short")["Variable_List"]
    assert "VJOB_OS" not in queued(marked, interactive=True)["Variable_List"]  # qsub -I: no script
    own = queued(marked, Variable_List={"VJOB_OS": "rocky9"})
    assert own["outcome"] == "accept" and own["Variable_List"]["VJOB_OS"] == "rocky9"


def test_opt_out_is_refused_where_not_allowed_and_clears_the_image_where_allowed(marked: Hook) -> None:
    refused = queued(marked, Variable_List={"VJOB_OS": "off"})
    assert refused["outcome"] == "reject"
    assert "every job of queue workq runs in a VM (image debian12)" in refused["message"]
    assert "does not let a job opt out" in refused["message"]
    marked.config["allow_opt_out"] = True
    allowed = queued(marked, Variable_List={"VJOB_OS": "off"})
    assert allowed["outcome"] == "accept" and allowed["Variable_List"]["VJOB_OS"] == ""
    elsewhere = queued(marked, queue="short", Variable_List={"VJOB_OS": "off"})
    assert elsewhere["outcome"] == "accept" and elsewhere["Variable_List"]["VJOB_OS"] == ""


# -- OpenPBS execjob_launch: the top shell becomes the pilot -------------------------------------


def launch_event(variables: dict[str, str], task: str = "1", **job: Any) -> dict[str, Any]:
    return {
        "type": "EXECJOB_LAUNCH",
        "job": _job(Variable_List={"PBS_O_WORKDIR": "/home/ann/run", **variables}, **job),
        "progname": "/bin/bash",
        "argv": ["-bash"],
        "env": {"PBS_TASKNUM": task, "PBS_JOBID": "12.pbs-01"},
    }


def test_the_launch_runs_vjob_on_the_script_in_the_submission_directory(marked: Hook, tmp_path: Path) -> None:
    got = run_event(marked, launch_event({"VJOB_OS": "debian12"}))
    assert got["outcome"] == "accept" and got["progname"] == "/bin/sh", got
    argv = got["argv"]
    assert argv[0] == "/bin/sh" and argv[-2:] == ["/usr/local/bin/vjob", "debian12"], argv
    # What the MoM then runs: that argv, the script on stdin, as the job's environment has it.
    vjob = tmp_path / "vjob"
    vjob.write_text(VJOB_STANDIN.format(python=sys.executable))
    vjob.chmod(0o755)
    workdir = tmp_path / "submitted from"
    workdir.mkdir()
    record = tmp_path / "record.json"
    env = {"PATH": "/usr/bin:/bin", "PBS_O_WORKDIR": str(workdir), "RECORD": str(record)}
    done = subprocess.run(
        [*argv[:-2], str(vjob), argv[-1]], input=SCRIPT, env=env, cwd=tmp_path, timeout=60, check=False
    )
    assert done.returncode == 3  # the pilot's (the script's) status is the job's
    seen = json.loads(record.read_text())
    assert seen["argv"] == ["run", "--rms", "pbs", "--os", "debian12", "--script", "-", "--"]
    assert seen["cwd"] == str(workdir) and seen["stdin"].encode("latin-1") == SCRIPT
    gone = subprocess.run(
        [*argv[:-2], str(vjob), argv[-1]],
        input=SCRIPT,
        env={**env, "PBS_O_WORKDIR": str(tmp_path / "gone")},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert gone.returncode == 2  # a submission directory that is gone fails the job, stages nothing


@pytest.mark.parametrize(
    ("variables", "task", "job"),
    [
        ({}, "1", {}),
        ({"VJOB_OS": ""}, "1", {}),
        ({"VJOB_OS": "off"}, "1", {}),
        ({"VJOB_OS": "debian-tiny"}, "1", {}),
        ({"VJOB_OS": "debian12"}, "2", {}),
        ({"VJOB_OS": "debian12"}, "1", {"interactive": True}),
    ],
    ids=["no-image", "opted-out", "off", "counter-guest", "spawned-task", "interactive"],
)
def test_other_launches_are_left_as_the_mom_made_them(
    marked: Hook, variables: dict[str, str], task: str, job: dict[str, Any]
) -> None:
    got = run_event(marked, launch_event(variables, task, **job))
    assert got["outcome"] == "accept" and got["progname"] == "/bin/bash" and got["argv"] == ["-bash"], got


def test_a_malformed_image_or_a_relative_vjob_command_refuses_the_launch_saying_which(marked: Hook) -> None:
    bad = run_event(marked, launch_event({"VJOB_OS": "x;reboot"}))
    assert bad["outcome"] == "reject" and "image 'x;reboot'" in bad["message"], bad
    marked.config["vjob_command"] = "vjob"
    rel = run_event(marked, launch_event({"VJOB_OS": "debian12"}))
    assert rel["outcome"] == "reject" and "vjob_command 'vjob'" in rel["message"], rel


# -- Torque: the wrap filter with the queue default and #VJOB off --------------------------------


@pytest.fixture
def torque(tmp_path: Path) -> Path:
    path = tmp_path / "vjob.toml"
    path.write_text(
        '[pbs]\nos_images = ["debian12", "debian-tiny"]\nfilter_budget_s = 5\n'
        'vjob_queues = {batch = "debian12"}\ndefault_queue = "batch"\nallow_opt_out = false\n'
    )
    return path


def test_torque_wraps_a_plain_script_of_the_default_or_named_vjob_queue(torque: Path) -> None:
    for args in ((), ("-q", "batch")):
        done = run_filter(SCRIPT, *args, config=torque)
        assert done.returncode == 0, done.stderr
        assert b"exec vjob run --rms pbs --os debian12 --script - --base64" in done.stdout
        assert b"VJOB_OS=debian12" in done.stdout and _payload(done.stdout) == SCRIPT
    other = run_filter(SCRIPT, "-q", "short", config=torque)
    assert other.returncode == 0 and b"exec vjob" not in other.stdout and b"VJOB_OS" not in other.stdout


def test_torque_opt_out_is_refused_where_not_allowed_and_left_bare_where_allowed(torque: Path) -> None:
    script = SCRIPT.replace(b"#PBS -N plain\n", b"#PBS -N plain\n#VJOB off\n")
    refused = run_filter(script, config=torque)
    assert refused.returncode != 0
    assert b"every job of queue batch runs in a VM (image debian12)" in refused.stderr, refused.stderr
    both = run_filter(script.replace(b"#VJOB off\n", b"#VJOB off\n#VJOB os=debian12\n"), config=torque)
    assert both.returncode != 0 and b"both '#VJOB off' and os=debian12" in both.stderr, both.stderr
    variable = run_filter(SCRIPT, "-v", "VJOB_OS=off", config=torque)  # OpenPBS's spelling, same rule
    assert variable.returncode != 0 and b"does not let a job opt out" in variable.stderr, variable.stderr
    torque.write_text(torque.read_text().replace("allow_opt_out = false", "allow_opt_out = true"))
    allowed = run_filter(script, config=torque)
    assert allowed.returncode == 0, allowed.stderr
    assert b"exec vjob" not in allowed.stdout and allowed.stdout.endswith(script.split(b"#VJOB off\n", 1)[1])


def test_the_adapter_reads_an_opted_out_job_as_asking_no_image() -> None:
    """A `-v VJOB_OS=off` left on the job (Torque keeps qsub's own -v) is no image called "off"."""
    assert job_os({"Variable_List": {"VJOB_OS": "off"}}, [], Conventions()) == ""
    assert job_os({"Variable_List": {"VJOB_OS": "debian12"}}, [], Conventions()) == "debian12"
