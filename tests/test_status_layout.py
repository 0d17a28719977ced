"""`vjob status` reads well in a pipe and in 80 columns (issue 36: rich cut the thirteen headers
of the vjobs table to two letters).

In a pipe: aligned plain text, every header whole on one line, one line per vjob. On a terminal
of 80 columns (a pseudo-terminal here, COLUMNS=80): no line wider than 80, every header whole.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

from agent.status_cmd import VJOB_COLUMNS
from vjob.pilot_files import PilotDir, PilotState, PilotStatus

REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path) -> Path:
    """A store that works and one saved vjob with a long VM name, so the table is wide."""
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    pdir = PilotDir(tmp_path / "data" / "pilots", "slurm", "1234567")
    pdir.ensure()
    status = PilotStatus(
        job_id="1234567",
        vm="vjob-slurm-1234567",
        node="compute-node-017",
        uri="qemu:///system",
        state=PilotState.SAVED,
        since=time.time(),
        save_bytes=3 * 2**30,
        save_seconds=12.5,
    )
    pdir.write_state(status)
    return config


def _cmd(config: Path) -> list[str]:
    return [sys.executable, "-m", "vjob.cli", "--config", str(config), "status", "--rms", "slurm"]


def test_in_a_pipe_the_headers_are_whole_and_aligned(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "80"}  # a pipe is not a terminal: no width applies
    res = subprocess.run(_cmd(_config(tmp_path)), capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    head = lines.index("vjobs (slurm)") + 1
    assert lines[head].split("  ")[0] == "job"
    for name in VJOB_COLUMNS:
        assert name in lines[head], lines[head]
    row = lines[head + 1]
    assert row.startswith("1234567") and "vjob-slurm-1234567" in row and "saved" in row
    # aligned: each header starts where its value starts
    assert lines[head].index("pilot") == row.index("saved")
    assert "│" not in res.stdout and "━" not in res.stdout  # no box drawing to step around


def test_on_a_terminal_of_80_columns_nothing_is_cut(tmp_path: Path) -> None:
    config = _config(tmp_path)
    main_fd, sub_fd = pty.openpty()
    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm"}
    proc = subprocess.Popen(_cmd(config), stdout=sub_fd, stderr=subprocess.PIPE, env=env, cwd=REPO)
    os.close(sub_fd)
    chunks = []
    while True:
        try:
            data = os.read(main_fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(main_fd)
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    for name in VJOB_COLUMNS:
        assert any(line.startswith(f"{name}:") for line in lines), (name, text)
    assert any(line.startswith("VM:") and "vjob-slurm-1234567" in line for line in lines), text
