"""The agent's caches of pilot state files and directory owner checks (agent.observe.hear;
issue 37 item 1): what changed on disk is seen at the next look, what did not is not read again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from agent.observe import hear
from agent.pilot_hear import HearMemo
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, all_dirs


def _pilot(root: Path, job_id: str, state: PilotState) -> PilotDir:
    pdir = PilotDir(root, "slurm", job_id)
    pdir.path.mkdir(parents=True, exist_ok=True)
    pdir.write_state(
        PilotStatus(job_id=job_id, vm=pdir.vm, node="n1", uri="qemu:///system", state=state, since=time.time())
    )
    return pdir


def test_a_changed_state_file_is_read_again_and_an_unchanged_one_is_not(tmp_path: Path) -> None:
    _pilot(tmp_path, "7", PilotState.RUNNING)
    memo = HearMemo()
    heard, _ = hear(all_dirs(tmp_path, "slurm"), {}, memo=memo)
    first = heard["7"][1]
    again, _ = hear(all_dirs(tmp_path, "slurm"), {}, memo=memo)
    assert again["7"][1] is first  # the same object: not read again
    _pilot(tmp_path, "7", PilotState.SAVED)
    heard, _ = hear(all_dirs(tmp_path, "slurm"), {}, memo=memo)
    assert heard["7"][1].state is PilotState.SAVED


def test_a_state_rewritten_in_place_with_its_old_time_is_still_seen(tmp_path: Path) -> None:
    pdir = _pilot(tmp_path, "8", PilotState.RUNNING)
    memo = HearMemo()
    hear(all_dirs(tmp_path, "slurm"), {}, memo=memo)
    before = os.stat(pdir.state_file)
    text = pdir.state_file.read_text().replace('"running"', '"saving"')
    with open(pdir.state_file, "w") as fh:  # same inode; the size may even stay
        fh.write(text)
    os.utime(pdir.state_file, ns=(before.st_atime_ns, before.st_mtime_ns))  # time set back: ctime moves
    heard, _ = hear(all_dirs(tmp_path, "slurm"), {}, memo=memo)
    assert heard["8"][1].state is PilotState.SAVING


def test_a_directory_given_to_another_owner_is_refused_at_once(tmp_path: Path) -> None:
    pdir = _pilot(tmp_path, "9", PilotState.RUNNING)
    memo = HearMemo()
    heard, refused = hear(all_dirs(tmp_path, "slurm"), {"9": "root"}, memo=memo)
    assert "9" in heard and not refused
    os.chown(pdir.path, 54321, 54321)  # somebody else's now (the test runs as root, as CI does)
    heard, refused = hear(all_dirs(tmp_path, "slurm"), {"9": "root"}, memo=memo)
    assert "9" not in heard and refused and "owned by uid 54321" in refused[0][2]
