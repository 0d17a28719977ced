"""`vjob drain`'s own agent is closed (agent.drain_cmd.drain), on PBS through the recorded
stand-ins (Torque cannot run here; tests/pbs_standins.py, as tests/test_drain_pbs.py).

With no agent holding the lease, the command ticks an agent of its own; that agent's store
connection stayed open after the command returned or raised at its timeout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import agent.loop
from agent import drain
from agent.drain_cmd import drain as vjob_drain
from agent.loop import Agent
from tests.pbs_standins import StandIns
from tests.test_pbs_agent import BATCH, RUNNING, _records
from vjob.config import parse
from vjob.errors import VjobError
from vjob.store.db import Store


def test_vjob_drains_own_agent_is_closed_whether_it_finishes_or_times_out(
    tmp_path: Path, shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torque = shared_dir / "data" / "fixtures" / "torque"
    standins = StandIns(tmp_path / "bin")
    qstat = tmp_path / "qstat.txt"
    qstat.write_text(_records((torque / "vsc_qstat_full.txt").read_text(), [*BATCH, RUNNING]))
    standins.script("qstat", stdout_file=qstat)
    standins.script("pbsnodes", stdout_file=torque / "vsc_pbsnodes_thinking.txt")
    config = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "agent": {"rms": "pbs"},
            "pbs": {"dialect": "torque", "torque_format": "text", "bin_dir": str(standins.dir)},
        }
    )
    store = Store(config.database_url)
    store.upgrade()
    built: list[Agent] = []

    class Kept(Agent):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(agent.loop, "Agent", Kept)
    outcome = vjob_drain(config, "pbs", timeout_s=120)
    assert outcome.done_by.startswith("vjob-drain@")  # its own pass
    drain.unmark(store, "pbs")
    with pytest.raises(VjobError, match="did not finish a drain pass within 0 s"):
        vjob_drain(config, "pbs", timeout_s=0)  # one tick of its own, then the timeout
    assert len(built) == 2
    assert [a.ports.store.opened for a in built] == [None, None], "vjob drain left its agent's store open"
    store.close()
