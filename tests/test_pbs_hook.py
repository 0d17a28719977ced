"""The OpenPBS hook, run as PBS runs it (a script importing `pbs`), against a small stand-in
`pbs` module that presents one event and records accept/reject, the job's Variable_List and
the log. OpenPBS itself cannot run here (docs/pbs.md)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.pbs_standins import PBS_MODULE, PILOT

HOOK = Path(__file__).resolve().parents[1] / "plugins" / "pbs" / "openpbs_hook.py"


class Hook:
    """Runs the hook once per event in a fresh interpreter, like the PBS server does."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        (tmp_path / "pbs.py").write_text(PBS_MODULE)
        self.pilot = tmp_path / "pilot"
        self.pilot.write_text(PILOT.format(python=sys.executable))
        self.pilot.chmod(self.pilot.stat().st_mode | stat.S_IXUSR)
        self.config: dict[str, Any] = {
            "checkpoint_command": [str(self.pilot), "checkpoint", "--job", "{job_id}"],
            "restore_command": [str(self.pilot), "restore", "--job", "{job_id}"],
            "command_timeout_s": 20,
            "state_dir": str(tmp_path / "state"),
        }

    def run(self, event_type: str, job: dict[str, Any], *, config_text: str | None = None) -> dict[str, Any]:
        config = self.dir / "vjob_hook.json"
        config.write_text(config_text if config_text is not None else json.dumps(self.config))
        spec = self.dir / "event.json"
        spec.write_text(json.dumps({"type": event_type, "job": job, "config": str(config)}))
        result = self.dir / "result.json"
        result.unlink(missing_ok=True)
        env = {
            **os.environ,
            "PYTHONPATH": str(self.dir),
            "PBS_STANDIN_EVENT": str(spec),
            "PBS_STANDIN_RESULT": str(result),
        }
        done = subprocess.run(
            [sys.executable, str(HOOK)], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        return json.loads(result.read_text())

    def pilot_script(self, **spec: Any) -> None:
        (self.dir / "pilot.json").write_text(json.dumps(spec))

    def pilot_calls(self) -> list[list[str]]:
        path = self.dir / "pilot_calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def hook(tmp_path: Path) -> Hook:
    return Hook(tmp_path)


def _job(**attrs: Any) -> dict[str, Any]:
    return {
        "id": "12.pbs-01",
        "queue": "workq",
        "interactive": None,
        "Variable_List": {"PBS_O_HOME": "/home/ann"},
        **attrs,
    }


def test_queuejob_tags_a_batch_job(hook: Hook) -> None:
    result = hook.run("QUEUEJOB", _job())
    assert result["outcome"] == "accept"
    assert result["Variable_List"] == {"PBS_O_HOME": "/home/ann", "VJOB_CLASS": "batch"}


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({"interactive": True}, "interactive"),  # qsub -I
        ({"queue": "interactive"}, "interactive"),  # the site's interactive queue
        ({"queue": "scavenger"}, "besteffort"),  # the site's best-effort queue
        ({"interactive": True, "Variable_List": {"VJOB_CLASS": "batch"}}, "interactive"),
        ({"Variable_List": None}, "batch"),
    ],
)
def test_queuejob_class(hook: Hook, attrs: dict[str, Any], expected: str) -> None:
    hook.config["besteffort_queues"] = ["scavenger"]
    result = hook.run("QUEUEJOB", _job(**attrs))
    assert result["outcome"] == "accept" and result["Variable_List"]["VJOB_CLASS"] == expected


def test_queuejob_os_from_variable_or_aoe(hook: Hook) -> None:
    hook.config["os_images"] = ["rocky9", "centos7"]
    result = hook.run("QUEUEJOB", _job(Variable_List={"VJOB_OS": "centos7"}))
    assert result["outcome"] == "accept" and result["Variable_List"]["VJOB_OS"] == "centos7"
    result = hook.run("QUEUEJOB", _job(Resource_List={"aoe": "rocky9"}))
    assert result["outcome"] == "accept" and result["Variable_List"]["VJOB_OS"] == "rocky9"
    result = hook.run("QUEUEJOB", _job(Resource_List={"select": "2:ncpus=4:aoe=centos7:mem=4gb"}))
    assert result["outcome"] == "accept" and result["Variable_List"]["VJOB_OS"] == "centos7"
    result = hook.run("QUEUEJOB", _job(Resource_List={"select": "1:ncpus=4:aoe=$(reboot)"}))
    assert result["outcome"] == "reject"


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"Variable_List": {"VJOB_OS": "windows95"}}, "OS image 'windows95' is not offered here; choose one of rocky9"),
        ({"Variable_List": {"VJOB_OS": "$(reboot)"}}, "OS image '$(reboot)': a name has only letters"),
        ({"Resource_List": {"aoe": "rocky9;rm -rf /"}}, "a name has only letters"),
    ],
)
def test_queuejob_refuses_what_the_site_does_not_offer(hook: Hook, attrs: dict[str, Any], message: str) -> None:
    hook.config["os_images"] = ["rocky9"]
    result = hook.run("QUEUEJOB", _job(**attrs))
    assert result["outcome"] == "reject" and message in result["message"]


@pytest.mark.parametrize("claimed", ["interactive", "besteffort", "urgent", "interactive\nqueued as batch"])
def test_queuejob_ignores_the_class_a_user_sets(hook: Hook, claimed: str) -> None:
    """Issue 23 item 10: `qsub -v VJOB_CLASS=interactive` (or `-V` with it in the environment)
    made a batch job interactive. The hook now overwrites it with the derived class and logs
    the attempt (repr'd: a newline in it cannot forge a log line)."""
    result = hook.run("QUEUEJOB", _job(Variable_List={"VJOB_CLASS": claimed, "PBS_O_HOME": "/home/ann"}))
    assert result["outcome"] == "accept" and result["Variable_List"]["VJOB_CLASS"] == "batch"
    warnings = [message for level, message in result["log"] if level == 2]
    assert warnings == [f"vjob: VJOB_CLASS {claimed!r} set by the user ignored, queued as batch"]
    result = hook.run("RUNJOB", _job(Variable_List={"VJOB_CLASS": "interactive"}))
    assert "class=batch" in str(result["log"])  # the audit trail shows the derived class too


def test_queuejob_fails_open_on_a_broken_configuration(hook: Hook) -> None:
    result = hook.run("QUEUEJOB", _job(Variable_List={"VJOB_OS": "anything"}), config_text="{not json")
    assert result["outcome"] == "accept"
    assert any("internal error, event accepted" in message for _level, message in result["log"])
    result = hook.run("QUEUEJOB", _job(), config_text=json.dumps({"os_imagez": []}))
    assert result["outcome"] == "accept" and "unknown key(s) in the hook configuration: os_imagez" in str(result["log"])


def test_runjob_logs_and_never_refuses(hook: Hook) -> None:
    result = hook.run("RUNJOB", _job(interactive=True, Variable_List={"VJOB_OS": "rocky9"}))
    assert result["outcome"] == "accept"
    assert "vjob: starting 12.pbs-01 class=interactive os=rocky9" in str(result["log"])


def test_postsuspend_checkpoints_through_the_pilot(hook: Hook) -> None:
    result = hook.run("EXECJOB_POSTSUSPEND", _job(id="673175[19].fruster.stanford.edu"))
    assert result["outcome"] == "accept"
    assert hook.pilot_calls() == [["checkpoint", "--job", "673175[19].fruster.stanford.edu"]]
    marker = hook.dir / "state" / "673175[19].fruster.stanford.edu.saved"
    assert marker.stat().st_mode & 0o777 == 0o600 and (hook.dir / "state").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"exit": 3, "stderr": "libvirt: no domain\n"}, "exit status 3: libvirt: no domain"),
        ({"sleep": 30}, "no answer within 1 s"),
    ],
)
def test_postsuspend_failure_leaves_the_job_suspended_in_memory(hook: Hook, spec: dict[str, Any], said: str) -> None:
    hook.pilot_script(**spec)
    hook.config["command_timeout_s"] = 1
    result = hook.run("EXECJOB_POSTSUSPEND", _job())
    assert result["outcome"] == "accept"
    log = str(result["log"])
    assert "checkpoint of 12.pbs-01 failed, job stays suspended in memory" in log and said in log
    assert not (hook.dir / "state" / "12.pbs-01.saved").exists()
    # Nothing was saved, so the resume needs no restore and is never refused.
    hook.pilot_script(exit=1)
    assert hook.run("EXECJOB_PRERESUME", _job())["outcome"] == "accept"
    assert hook.pilot_calls() == [["checkpoint", "--job", "12.pbs-01"]]


def test_preresume_restores_a_saved_vm_or_refuses_the_resume(hook: Hook) -> None:
    assert hook.run("EXECJOB_POSTSUSPEND", _job())["outcome"] == "accept"
    hook.pilot_script(exit=1, stderr="no saved memory state for 12.pbs-01\n")
    result = hook.run("EXECJOB_PRERESUME", _job())
    assert result["outcome"] == "reject"
    assert "cannot restore the VM of 12.pbs-01, not resuming" in result["message"]
    assert "no saved memory state" in result["message"]
    hook.pilot_script()
    assert hook.run("EXECJOB_PRERESUME", _job())["outcome"] == "accept"
    assert not (hook.dir / "state" / "12.pbs-01.saved").exists()
    assert hook.pilot_calls() == [["checkpoint", "--job", "12.pbs-01"], *[["restore", "--job", "12.pbs-01"]] * 2]


def test_suspend_and_resume_are_left_to_pbs_when_the_commands_are_off(hook: Hook) -> None:
    hook.config.update(checkpoint_command=[], restore_command=[])
    assert hook.run("EXECJOB_POSTSUSPEND", _job())["outcome"] == "accept"
    assert hook.run("EXECJOB_PRERESUME", _job())["outcome"] == "accept"
    assert hook.pilot_calls() == [] and not (hook.dir / "state").exists()


def test_a_hostile_job_id_never_reaches_the_pilot(hook: Hook) -> None:
    result = hook.run("EXECJOB_POSTSUSPEND", _job(id="12; rm -rf /"))
    assert result["outcome"] == "accept" and "is not a PBS job id" in str(result["log"])
    assert hook.run("EXECJOB_PRERESUME", _job(id="../../etc/passwd"))["outcome"] == "accept"
    assert hook.pilot_calls() == []


def test_other_events_are_accepted_untouched(hook: Hook) -> None:
    result = hook.run("MODIFYJOB", _job())
    assert result["outcome"] == "accept" and result["Variable_List"] == {"PBS_O_HOME": "/home/ann"}


def test_the_shipped_hook_configuration(hook: Hook) -> None:
    """deploy/pbs/vjob_hook.json is what operators import: it must load, tag, and never call the
    stand-in pilot (its commands name the real `vjob vm save|restore`, tested on a real VM in
    tests/test_pbs_hook_realvm.py)."""
    shipped = json.loads((HOOK.parents[2] / "deploy" / "pbs" / "vjob_hook.json").read_text())
    shipped["state_dir"] = str(hook.dir / "state")
    result = hook.run("QUEUEJOB", _job(Variable_List={"VJOB_OS": "debian-tiny"}), config_text=json.dumps(shipped))
    assert result["outcome"] == "accept" and result["log"] == [[1, "vjob: queued as batch, os debian-tiny"]]
    result = hook.run("QUEUEJOB", _job(Variable_List={"VJOB_OS": "centos7"}), config_text=json.dumps(shipped))
    assert result["outcome"] == "reject"
    assert hook.run("EXECJOB_POSTSUSPEND", _job(), config_text=json.dumps(shipped))["outcome"] == "accept"
    assert hook.pilot_calls() == []
