"""`vjob agent --once` exits with what its tick did (issue 36 item 3): 1 when the tick failed,
so that a cron job or a health check that runs it can trust its status. The RMS here is PBS
with no client commands at all (a bin_dir with none in it): the observation fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vjob.store.db import Store

REPO = Path(__file__).resolve().parents[1]


def test_a_failed_tick_exits_1_and_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n[agent]\nrms = "pbs"\n[pbs]\nbin_dir = "{empty}"\n')
    store = Store(f"sqlite:///{tmp_path / 'data' / 'vjob.sqlite'}")
    store.upgrade()
    store.close()
    done = subprocess.run(
        [sys.executable, "-m", "vjob.cli", "agent", "--rms", "pbs", "--once"],
        cwd=REPO,
        env={**os.environ, "VJOB_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "the tick did not run whole" in done.stderr
