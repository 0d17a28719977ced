"""The pilot (`vjob run`) as a real process over libvirt's test driver: boot, checkpoint on the
agent's request or on SIGTERM, restore on restart (locally or not), resume when not requeued.

The test driver keeps its domains inside the pilot's process, which is exactly a node whose
libvirt forgets everything when the job ends: the next pilot can only continue from the saved
state file, as after a requeue onto a fresh node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.services import wait_for
from vjob.pilot_files import PilotDir, PilotState

pytestmark = pytest.mark.libvirt
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "vjob.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n[provisioning]\ndefault_uri = "test:///default"\n'
    )
    return tmp_path


def _pilot(site: Path, job: str, node: str, *extra: str, restarts: str | None = None) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "vjob.cli",
        "--config",
        str(site / "vjob.toml"),
        "run",
        "--job-id",
        job,
        "--node",
        node,
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    if restarts is not None:
        env["SLURM_RESTART_COUNT"] = restarts
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _pdir(site: Path, job: str) -> PilotDir:
    return PilotDir(site / "data" / "pilots", "slurm", job)


def _state(site: Path, job: str) -> PilotState | None:
    st = _pdir(site, job).read_state()
    return None if st is None else st.state


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out


def test_requested_checkpoint_then_requeue_then_local_restore(site: Path):
    first = _pilot(site, "41", "node1")
    try:
        wait_for(lambda: _state(site, "41") is PilotState.RUNNING, 60, "pilot running")
        pdir = _pdir(site, "41")
        pdir.request_checkpoint("switch-1-action-1")
        wait_for(lambda: pdir.saved_for("switch-1-action-1"), 30, "checkpoint answered")
        st = pdir.read_state()
        assert st.saved_node == "node1" and st.save_bytes > 0
        assert os.stat(st.memory_path).st_mode & 0o777 == 0o600
        assert first.poll() is None, "the pilot must wait to be requeued, not end the job"
    finally:
        rc, out = _stop(first)
    assert rc == 0, out
    assert "requeued by the resource manager" in out

    second = _pilot(site, "41", "node1")
    try:
        wait_for(lambda: _state(site, "41") is PilotState.RUNNING, 60, "pilot restored")
        st = _pdir(site, "41").read_state()
        assert (st.boots, st.restores, st.local_restores) == (1, 1, 1)
        assert not st.memory_path or not Path(st.memory_path).exists()  # no fallback path: /nonexistent may exist
    finally:
        rc, out = _stop(second)
    assert "restoring VM vjob-slurm-41 locally on node1" in out
    # SIGTERM while running saves the VM before exiting: the next start can continue.
    st = _pdir(site, "41").read_state()
    assert rc == 0 and st.state is PilotState.SAVED and st.memory_saved and st.request_id == ""

    third = _pilot(site, "41", "node3")
    try:
        wait_for(lambda: _state(site, "41") is PilotState.RUNNING, 60, "pilot restored elsewhere")
        st = _pdir(site, "41").read_state()
        assert (st.restores, st.local_restores, st.node) == (2, 1, "node3")
    finally:
        _stop(third)


def test_a_checkpoint_not_followed_by_a_requeue_resumes_the_vm(site: Path):
    proc = _pilot(site, "42", "node1", "--orphan-resume", "60")
    try:
        wait_for(lambda: _state(site, "42") is PilotState.RUNNING, 60, "pilot running")
        pdir = _pdir(site, "42")
        pdir.request_checkpoint("switch-9-action-9")
        wait_for(lambda: pdir.saved_for("switch-9-action-9"), 30, "checkpoint answered")
        pdir.withdraw_request()  # the agent gave up (or a restarted agent rolled the switch back)
        wait_for(lambda: _state(site, "42") is PilotState.RUNNING, 30, "pilot resumed")
        st = pdir.read_state()
        assert st.restores == 1 and not st.memory_saved
        assert proc.poll() is None
    finally:
        _stop(proc)


def test_unknown_os_image_is_refused_before_anything_starts(site: Path):
    proc = _pilot(site, "43", "node1", "--os", "windows95")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "OS image 'windows95'" in out and "debian-tiny" in out
    assert _pdir(site, "43").read_state() is None


def test_a_pilot_outside_a_job_says_what_is_missing(site: Path):
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    cmd = [sys.executable, "-m", "vjob.cli", "--config", str(site / "vjob.toml"), "run"]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "SLURM_JOB_ID" in res.stderr


def test_a_new_job_reusing_an_old_job_id_never_gets_the_old_vm(site: Path):
    old = _pilot(site, "44", "node1")
    wait_for(lambda: _state(site, "44") is PilotState.RUNNING, 60, "old pilot running")
    _stop(old)  # SIGTERM: the old job's VM is saved under job id 44
    saved = _pdir(site, "44").read_state()
    assert saved.memory_saved

    new = _pilot(site, "44", "node2", restarts="0")  # a first start: the saved state is not ours
    try:
        wait_for(lambda: _state(site, "44") is PilotState.RUNNING, 60, "new pilot running")
        st = _pdir(site, "44").read_state()
        assert (st.boots, st.restores) == (1, 0)
        assert not Path(saved.memory_path).exists()
    finally:
        _, out = _stop(new)
    assert "discarding the state of an older job 44" in out


def test_sigusr1_checkpoints_and_waits_for_the_requeue(site: Path):
    # What an operator gets with `scancel --batch --signal=USR1 JOB` (then requeuehold).
    proc = _pilot(site, "45", "node1", "--orphan-resume", "60")
    try:
        wait_for(lambda: _state(site, "45") is PilotState.RUNNING, 60, "pilot running")
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: _state(site, "45") is PilotState.SAVED, 30, "checkpoint on SIGUSR1")
        time.sleep(2)
        assert _state(site, "45") is PilotState.SAVED, "no request file to withdraw: it must keep waiting"
        assert proc.poll() is None
    finally:
        rc, out = _stop(proc)
    assert rc == 0 and "requeued by the resource manager" in out
    assert _pdir(site, "45").read_state().memory_saved


def test_a_first_start_removes_what_an_older_job_of_its_id_left_on_the_node(site: Path):
    """The node keeps the older job's saved VM while this pilot's directory knows nothing of
    it (a wiped controller, a pilot directory elsewhere): a first start boots afresh."""
    old = _pilot(site, "45", "node1")
    wait_for(lambda: _state(site, "45") is PilotState.RUNNING, 60, "old pilot running")
    _stop(old)
    saved = _pdir(site, "45").read_state()
    assert saved.memory_saved and Path(saved.memory_path).exists()
    _pdir(site, "45").state_file.unlink()

    new = _pilot(site, "45", "node1", restarts="0")
    try:
        wait_for(lambda: _state(site, "45") is PilotState.RUNNING, 60, "new pilot running")
        st = _pdir(site, "45").read_state()
        assert (st.boots, st.restores) == (1, 0)
        assert not Path(saved.memory_path).exists()
    finally:
        _, out = _stop(new)
    assert "removing VM vjob-slurm-45 of an older job 45" in out
