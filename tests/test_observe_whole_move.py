"""The agent's own whole move is no stray claim (agent.observe._remember_vms).

A vjob of several VMs moved whole (agent.remap_whole: one suspend, one resume naming every VM's
node) runs off its RMS allocation, and the journal holds no `migrate` for it — only the resume
of its first VM. The observation believed a VM off its allocation only where a journalled
migration had put it, so every tick warned "pilot claims a node the RMS did not allocate" for
each such job, for as long as it stayed moved, and never recorded it. Root's record of the move
(the store's `vms` rows the remap step and the control loop write once the pilot answered)
now vouches for it, as it does for the remapping itself (agent.remap_whole.believed).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import _remember_vms
from vjob.config import parse
from vjob.model import Job, JobState
from vjob.pilot_files import PilotState, PilotStatus
from vjob.store import vms as store_vms
from vjob.store.db import Store

STRAY = "pilot claims a node the RMS did not allocate"


class _Log:
    """The agent's logger, its warnings kept."""

    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.warnings.append((event, kw))

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None


def _moved(nodes: list[str]) -> PilotStatus:
    return PilotStatus(
        job_id="21",
        vm="vjob-slurm-21-0",
        node=nodes[0],
        uri="test:///default",
        state=PilotState.RUNNING,
        since=time.time(),
        memory_mb=256,
        member_nodes=nodes,
    )


def test_a_vjob_the_agent_moved_whole_is_recorded_and_not_warned_about(tmp_path: Path, store: Store) -> None:
    cfg = parse({"data_dir": str(tmp_path / "data"), "agent": {"pilot_dir": str(tmp_path / "pilots")}})
    with Agent(cfg, object(), rms="slurm", metrics=AgentMetrics()) as agent:  # type: ignore[arg-type]
        agent.ports.store.opened = store
        log = _Log()
        agent.ports.log = log
        job = Job("21", "root", rms="slurm", state=JobState.RUNNING, nodes=2, allocated_nodes=("s1", "s2"))
        # what the remap step records once the pilot answered the whole move's resume
        for vm, node in (("vjob-slurm-21-0", "f1"), ("vjob-slurm-21-1", "f2")):
            store_vms.remember(store, "slurm", job, vm=vm, node=node, image="")
        for _tick in range(3):
            _remember_vms(agent.ports, store, [job], {"21": _moved(["f1", "f2"])})
        assert [e for e, _ in log.warnings] == []
        assert agent.ports.recorded_vms["21"] == ("f1,f2", "")
        # a node root recorded for no VM of the job is still the user's word: warned, not recorded
        agent.ports.recorded_vms.clear()
        _remember_vms(agent.ports, store, [job], {"21": _moved(["f1", "s3"])})
        assert log.warnings == [(STRAY, {"jobs": ["21"], "node": "s3"})]
        assert sorted((v.name, v.node) for v in store_vms.of_job(store, "slurm", "21")) == [
            ("vjob-slurm-21-0", "f1"),
            ("vjob-slurm-21-1", "f2"),
        ]
