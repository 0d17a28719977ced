"""`vjob agent --rms pbs --once` runs the same policies over the PBS adapter: one tick against
stand-in Torque commands replaying recorded KU Leuven records, checked through the qalter
calls it makes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.pbs_standins import StandIns
from vjob.store.db import Store

INTERACTIVE = ["20034501.icts-p-svcs-1", "20034502.icts-p-svcs-1"]
BATCH = ["20025307.icts-p-svcs-1", "20025920.icts-p-svcs-1", "20028843.icts-p-svcs-1"]
RUNNING = "20033335.icts-p-svcs-1"


def _records(text: str, wanted: list[str]) -> str:
    """The recorded `qstat -f` blocks of the wanted jobs, in the recorded layout."""
    blocks = {b.split("\n", 1)[0].removeprefix("Job Id: "): b for b in re.split(r"\n(?=Job Id: )", text)}
    return "\n".join(blocks[j].rstrip("\n") + "\n" for j in wanted)


def test_one_agent_tick_sets_ubis_priorities_with_qalter(tmp_path: Path, shared_dir: Path) -> None:
    torque = shared_dir / "data" / "fixtures" / "torque"
    standins = StandIns(tmp_path / "bin")
    qstat = tmp_path / "qstat.txt"
    qstat.write_text(_records((torque / "vsc_qstat_full.txt").read_text(), [*INTERACTIVE, *BATCH, RUNNING]))
    standins.script("qstat", stdout_file=qstat)
    standins.script("pbsnodes", stdout_file=torque / "vsc_pbsnodes_thinking.txt")
    config = tmp_path / "vjob.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[agent]\nrms = "pbs"\n'
        f'[pbs]\ndialect = "torque"\ntorque_format = "text"\nbin_dir = "{standins.dir}"\n'
    )
    store = Store(f"sqlite:///{tmp_path / 'data' / 'vjob.sqlite'}")
    store.upgrade()
    store.close()
    env = {**os.environ, "VJOB_CONFIG": str(config)}
    done = subprocess.run(
        [sys.executable, "-m", "vjob.cli", "agent", "--rms", "pbs", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    calls = standins.calls()
    assert ["qstat", "-f", "-t"] in calls and ["pbsnodes", "-a"] in calls
    priorities = {c[3]: int(c[2]) for c in calls if c[0] == "qalter"}
    assert all(c[:2] == ["qalter", "-p"] for c in calls if c[0] == "qalter")
    assert set(priorities) == set(INTERACTIVE + BATCH)  # every pending job, not the running one
    assert all(-1024 <= p <= 1023 for p in priorities.values())
    assert min(priorities[j] for j in INTERACTIVE) > max(priorities[j] for j in BATCH)
