"""A drained agent on PBS: `qrls` for the job it checkpointed, `qalter -p 0` where its order is.

Torque cannot run here: the recorded KU Leuven `qstat -f` records play the server through the
stand-in commands (tests/pbs_standins.py), rewritten between ticks as the server would hold them:
after the first (undrained) tick each queued job's Priority is the value the agent sent, and one
batch job is held (`job_state = H`) with its checkpoint in the store (the agent's own
`record_preemption`) and its pilot's saved state. The drained tick must send exactly `qrls -h u`
for that job and `qalter -p 0` for every job holding another Priority, and nothing else; a second
drained tick, the server now holding 0 everywhere, sends nothing at all.
"""

from __future__ import annotations

import re
from pathlib import Path

from agent import drain
from agent.loop import Agent
from plugins.pbs.adapter import PbsAdapter
from plugins.pbs.config import PbsConfig
from tests.pbs_standins import StandIns
from tests.test_pbs_agent import BATCH, RUNNING, _records
from tests.test_site_priority_pbs import _with_priorities
from vjob.config import parse
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, pilot_root
from vjob.store import jobs as store_jobs
from vjob.store.db import Store


def _held(text: str, job: str) -> str:
    """The record of `job` with `job_state = H` (held), as qstat shows a requeue-held job."""
    blocks = re.split(r"\n(?=Job Id: )", text)
    out = []
    for block in blocks:
        if block.startswith(f"Job Id: {job}\n"):
            block, n = re.subn(r"\n    job_state = [A-Z]\n", "\n    job_state = H\n", block)
            assert n == 1
        out.append(block)
    return "\n".join(out)


def test_a_drained_tick_releases_and_sets_priorities_back(tmp_path: Path, shared_dir: Path) -> None:
    torque = shared_dir / "data" / "fixtures" / "torque"
    standins = StandIns(tmp_path / "bin")
    # Batch jobs only: the stand-in qstat prints every record whatever job it is asked about, so
    # the comment of one interactive job cannot be read back (the Slurm test clears real notes).
    recorded = _records((torque / "vsc_qstat_full.txt").read_text(), [*BATCH, RUNNING])
    qstat = tmp_path / "qstat.txt"
    qstat.write_text(recorded)
    standins.script("qstat", stdout_file=qstat)
    standins.script("pbsnodes", stdout_file=torque / "vsc_pbsnodes_thinking.txt")
    config = parse({"data_dir": str(tmp_path / "data"), "agent": {"rms": "pbs"}})
    store = Store(config.database_url)
    store.upgrade()
    adapter = PbsAdapter(PbsConfig(dialect="torque", torque_format="text", bin_dir=str(standins.dir)))
    agent = Agent(config, adapter, rms="pbs")
    assert not agent.tick().errors
    sent = {c[3]: int(c[2]) for c in standins.calls() if c[0] == "qalter"}
    assert set(sent) == set(BATCH) and any(sent.values())

    victim = BATCH[0]  # as after the agent's checkpoint: held, Pn in the store, its VM saved
    store_jobs.record_preemption(store, "pbs", victim)
    pdir = PilotDir(pilot_root(config), "pbs", victim)
    pdir.ensure()
    memory = tmp_path / "mem.save"
    memory.write_bytes(b"saved")
    pdir.write_state(
        PilotStatus(
            job_id=victim,
            vm=pdir.vm,
            node="r22i13n01",
            uri="test:///default",
            state=PilotState.SAVED,
            since=0.0,
            saved_node="r22i13n01",
            saved_nodes=["r22i13n01"],
            memory_path=str(memory),
        )
    )
    qstat.write_text(_held(_with_priorities(recorded, sent), victim))
    mark = drain.mark(store, "pbs", "root@ctl")
    before = len(standins.calls())
    report = agent.tick()
    assert not report.errors, report.errors
    assert report.released == [victim] and report.checkpointed == []
    acting = [c for c in standins.calls()[before:] if c[0] in ("qalter", "qrls", "qhold", "qrerun")]
    nonzero = sorted(j for j, v in sent.items() if v != 0)
    assert acting[0] == ["qrls", "-h", "u", victim]
    assert sorted(acting[1:]) == sorted(["qalter", "-p", "0", j] for j in nonzero)
    done = drain.read_mark(store, drain.done_name("pbs"))
    assert done is not None and done.since >= mark.since  # what `vjob drain` waits for

    qstat.write_text(recorded)  # the server after the drained tick: Priority 0, the victim queued
    before = len(standins.calls())
    assert not agent.tick().errors
    assert [c for c in standins.calls()[before:] if c[0] != "qstat" and c[0] != "pbsnodes"] == []
