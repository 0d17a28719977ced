"""PBS preemption: an interactive `qsub -I` job makes the agent checkpoint a batch vjob with
qhold + qrerun, and the victim is released (qrls) once the interactive job is gone.

PBS cannot run on the development machine, so — as in tests/test_pbs_agent.py — the commands
are stand-ins (tests/pbs_standins.py): executables named qstat, pbsnodes, qhold, qrerun, qrls
and qalter that record their argument lists and print recorded real output, in both dialects:
Torque (the KU Leuven `qstat -f` and `pbsnodes -a` text of tests/data/fixtures/torque) and
OpenPBS (the MetaCentrum `qstat -f -F json` record; its `pbsnodes -av -F json` is in the
layout of the reference guide, as no recording exists). Between the test's steps the fields a
real server changes are rewritten in the records (job_state, exec_host, Hold_Types, the
node's state and jobs; the owner is the user running the test, who owns the pilot
directories): a requeued job with its user hold shows job_state = H and no exec_host, as in
`qstat -f` after `qhold -h u` + `qrerun`. What is real: the agent's whole tick (observe, the
scheduling pass, the planner, the executor and its journal, the pilot request files, the
release), the PBS adapter and its parsers; the pilot is tests/stand_ins.answering_pilot, which
saves on the agent's request through vjob.pilot_files, as a real pilot's state file says.
"""

from __future__ import annotations

import copy
import getpass
import json
import re
import time
from pathlib import Path
from typing import ClassVar

import pytest
import structlog

from agent.loop import Agent
from agent.metrics import AgentMetrics
from plugins.pbs.adapter import make_adapter
from tests.pbs_standins import StandIns
from tests.stand_ins import answering_pilot
from vjob.config import parse
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
from vjob.store import jobs as store_jobs
from vjob.store import journal
from vjob.store.db import Store

FIXTURES = Path(__file__).parent / "data" / "fixtures"


def _blocks(text: str, head: str) -> dict[str, str]:
    """Recorded records by name: `Job Id: X` blocks of `qstat -f`, or `pbsnodes -a` blocks."""
    parts = re.split(r"\n(?=Job Id: )", text) if head else re.split(r"\n\s*\n", text)
    return {p.split("\n", 1)[0].removeprefix(head).strip(): p.strip("\n") + "\n" for p in parts if p.strip()}


def _set(block: str, key: str, value: str | None) -> str:
    """The record with `key = value` (its continuation lines replaced), None: the key dropped."""
    pattern = re.compile(rf"^( +){re.escape(key)} = .*\n(?:\t.*\n)*", re.M)
    if pattern.search(block) is None:
        return block if value is None else block + f"    {key} = {value}\n"
    return pattern.sub(lambda m: "" if value is None else f"{m.group(1)}{key} = {value}\n", block, count=1)


class Cluster:
    """What the stand-in qstat and pbsnodes print: recorded records in the test's state.

    Two batch jobs (`batch`), each running on a whole node of its own (`node_of`), and one
    interactive job asking for one node."""

    batch: tuple[str, str]
    interactive: str
    node_of: ClassVar[dict[str, str]]
    dialect_config: ClassVar[dict[str, str]]

    def __init__(self, standins: StandIns, tmp_path: Path) -> None:
        self.qstat, self.pbsnodes = tmp_path / "qstat.out", tmp_path / "pbsnodes.out"
        standins.script("qstat", stdout_file=self.qstat)
        standins.script("pbsnodes", stdout_file=self.pbsnodes)

    def show(self, running: dict[str, str], held: tuple[str, ...] = (), queued: tuple[str, ...] = ()) -> None:
        """Write the records: `running` job → node (whole node), `held` (H), `queued` (Q)."""
        states = [*((j, "R") for j in running), *((j, "H") for j in held), *((j, "Q") for j in queued)]
        by_node = {node: job for job, node in running.items()}
        self.write(states, running, by_node)

    def write(self, states: list[tuple[str, str]], running: dict[str, str], by_node: dict[str, str]) -> None:
        raise NotImplementedError


class TorqueCluster(Cluster):
    """The KU Leuven Torque records (`qstat -f`, `pbsnodes -a` text): two recorded jobs as the
    batch vjobs and the recorded `qsub -I -X` job (interactive = True)."""

    batch = ("20033335.icts-p-svcs-1", "20025307.icts-p-svcs-1")
    interactive = "20034501.icts-p-svcs-1"
    node_of: ClassVar[dict[str, str]] = {"20033335.icts-p-svcs-1": "r10n5", "20025307.icts-p-svcs-1": "r10n6"}
    dialect_config: ClassVar[dict[str, str]] = {"dialect": "torque", "torque_format": "text"}

    def __init__(self, standins: StandIns, tmp_path: Path) -> None:
        super().__init__(standins, tmp_path)
        self.jobs = _blocks((FIXTURES / "torque" / "vsc_qstat_full.txt").read_text(), "Job Id: ")
        self.nodes = _blocks((FIXTURES / "torque" / "vsc_pbsnodes_thinking.txt").read_text(), "")

    def write(self, states: list[tuple[str, str]], running: dict[str, str], by_node: dict[str, str]) -> None:
        user = getpass.getuser()
        out = []
        for job_id, state in states:
            block = _set(self.jobs[job_id], "job_state", state)
            block = _set(block, "euser", user)
            block = _set(block, "Job_Owner", f"{user}@r6i0n1")
            host = "+".join(f"{running[job_id]}/{c}" for c in range(20)) if state == "R" else None
            block = _set(block, "exec_host", host)
            block = _set(block, "Hold_Types", "u" if state == "H" else "n")
            for key, value in (("nodes", "1:ppn=20"), ("neednodes", "1:ppn=20"), ("nodect", "1")):
                block = _set(block, f"Resource_List.{key}", value)
            out.append(block)
        self.qstat.write_text("\n".join(out))
        nodes = []
        for name in self.node_of.values():
            block = _set(self.nodes[name], "state", "job-exclusive" if name in by_node else "free")
            block = _set(block, "jobs", f"0-19/{by_node[name]}" if name in by_node else None)
            nodes.append(name + "\n" + block.split("\n", 1)[1])
        self.pbsnodes.write_text("\n".join(nodes) + "\n")


class OpenPbsCluster(Cluster):
    """OpenPBS `qstat -f -F json`: the one recorded MetaCentrum job record, under three ids
    (the third `interactive`, as `qsub -I` sets it), on its recorded nodes charon24 and
    charon21; `pbsnodes -av -F json` in the layout of tests/test_pbs_parse.OPENPBS_NODES (no
    recording of it exists)."""

    batch = ("12860476.meta-pbs.metacentrum.cz", "12860477.meta-pbs.metacentrum.cz")
    interactive = "12860478.meta-pbs.metacentrum.cz"
    node_of: ClassVar[dict[str, str]] = {
        "12860476.meta-pbs.metacentrum.cz": "charon24",
        "12860477.meta-pbs.metacentrum.cz": "charon21",
    }
    dialect_config: ClassVar[dict[str, str]] = {"dialect": "openpbs"}

    def __init__(self, standins: StandIns, tmp_path: Path) -> None:
        super().__init__(standins, tmp_path)
        self.recorded = json.loads((FIXTURES / "openpbs" / "metacentrum_pbspro19_qstat_xf_F_json.json").read_text())

    def write(self, states: list[tuple[str, str]], running: dict[str, str], by_node: dict[str, str]) -> None:
        user = getpass.getuser()
        (record,) = self.recorded["Jobs"].values()
        jobs = {}
        for job_id, state in states:
            job = copy.deepcopy(record)
            job.update(job_state=state, Job_Owner=f"{user}@META", euser=user, Hold_Types="u" if state == "H" else "n")
            job["Resource_List"].update(select="1:ncpus=64", ncpus=64, nodect=1, place="excl")
            for key in ("exec_host", "exec_host2", "exec_vnode"):
                job.pop(key, None)
            if state == "R":
                job["exec_host"] = f"{running[job_id]}/0*64"
                job["exec_vnode"] = f"({running[job_id]}:ncpus=64)"
            if job_id == self.interactive:
                job["interactive"] = "True"
            jobs[job_id] = job
        self.qstat.write_text(json.dumps({**self.recorded, "Jobs": jobs}))
        nodes = {}
        for name in self.node_of.values():
            nodes[name] = {
                "state": "job-busy" if name in by_node else "free",
                "pcpus": 64,
                "resources_available": {"ncpus": 64, "mem": "256gb", "host": name, "vnode": name},
                "resources_assigned": {"ncpus": 64 if name in by_node else 0},
            }
            if name in by_node:
                nodes[name]["jobs"] = [f"{by_node[name]}/{c}" for c in range(64)]
        self.pbsnodes.write_text(json.dumps({"pbs_server": "meta-pbs.metacentrum.cz", "nodes": nodes}))


def _agent(tmp_path: Path, standins: StandIns, cluster: Cluster) -> tuple[Agent, Store]:
    cfg = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "agent": {"rms": "pbs", "pilot_dir": str(tmp_path / "pilots"), "checkpoint_timeout_s": 30},
            "priority": {"interactive_cap": 0.5},  # one of the two nodes
            "pbs": {**cluster.dialect_config, "bin_dir": str(standins.dir)},
        }
    )
    store = Store(f"sqlite:///{tmp_path / 'data' / 'vjob.sqlite'}")
    store.upgrade()
    agent = Agent(cfg, make_adapter(cfg), rms="pbs", metrics=AgentMetrics(), owner="A")
    agent.ports.store.opened = store
    return agent, store


def _pilot(agent: Agent, job_id: str, node: str) -> PilotDir:
    """The directory of the batch job's pilot, its VM running on the job's node."""
    pdir = PilotDir(agent.ports.root, "pbs", job_id)
    pdir.ensure()
    pdir.write_state(
        PilotStatus(
            job_id=job_id,
            vm=f"vjob-pbs-{job_id}",
            node=node,
            uri="qemu:///system",
            state=PilotState.RUNNING,
            since=time.time(),
            memory_mb=1024,
            image="debian12",
        )
    )
    return pdir


def _rms_calls(standins: StandIns, start: int) -> list[list[str]]:
    """The acting commands since call `start` (qstat, pbsnodes and qalter left out)."""
    return [c for c in standins.calls()[start:] if c[0] in ("qhold", "qrerun", "qrls", "qsig", "qsub")]


@pytest.fixture(params=[TorqueCluster, OpenPbsCluster], ids=["torque", "openpbs"])
def scene(request, tmp_path: Path) -> tuple[Cluster, StandIns, Agent, Store, dict[str, PilotDir]]:
    standins = StandIns(tmp_path / "bin")
    cluster = request.param(standins, tmp_path)
    agent, store = _agent(tmp_path, standins, cluster)
    pilots = {job: _pilot(agent, job, node) for job, node in cluster.node_of.items()}
    cluster.show(running=dict(cluster.node_of), queued=(cluster.interactive,))
    return cluster, standins, agent, store, pilots


def _saving_pilots(standins: StandIns, pilots: dict[str, PilotDir], tmp_path: Path, before_save: list):
    """Stand-in pilots that save on the agent's request after half a second, noting the PBS
    calls made by then in `before_save` (none of qhold/qrerun may come before the save)."""
    t0 = time.monotonic()

    def when() -> bool:
        if time.monotonic() - t0 < 0.5:
            return False
        before_save.append(_rms_calls(standins, 0))
        return True

    return [answering_pilot(p, when, tmp_path / f"{j}.state") for j, p in pilots.items()]


def test_an_interactive_job_checkpoints_a_vjob_with_qhold_qrerun_and_it_is_released_after(scene, tmp_path) -> None:
    cluster, standins, agent, store, pilots = scene
    before_save: list = []
    first, second = _saving_pilots(standins, pilots, tmp_path, before_save)
    with first as seen_first, second as seen_second:
        report = agent.tick()
    (victim,) = report.checkpointed
    (other,) = set(cluster.batch) - {victim}
    seen = dict(zip(pilots, (seen_first, seen_second), strict=True))
    assert len(seen[victim]) == 1 and seen[other] == []  # one request, to the victim's pilot only
    assert before_save == [[]]  # the agent waited for the save before touching PBS
    assert pilots[victim].read_state().state is PilotState.SAVED
    assert _rms_calls(standins, 0) == [["qhold", "-h", "u", victim], ["qrerun", victim]]
    assert store_jobs.get(store, "pbs", victim).preempted_since is not None
    assert journal.recent(store, limit=1)[0].state == "done"

    # PBS requeued the victim with the user hold on (H); the interactive job starts on its node
    mark = len(standins.calls())
    cluster.show(running={cluster.interactive: cluster.node_of[victim], other: cluster.node_of[other]}, held=(victim,))
    report = agent.tick()
    assert report.checkpointed == [] and report.released == []
    assert _rms_calls(standins, mark) == []  # held while the interactive job holds its node

    # the interactive session ends: the victim is released, once
    mark = len(standins.calls())
    cluster.show(running={other: cluster.node_of[other]}, held=(victim,))
    report = agent.tick()
    assert report.released == [victim]
    assert _rms_calls(standins, mark) == [["qrls", "-h", "u", victim]]


def test_a_failed_qrerun_releases_the_hold_and_says_so(scene, tmp_path) -> None:
    """A job submitted `-r n` (Rerunable = False) cannot be requeued: qrerun exits non-zero
    with a diagnostic on stderr. The hold the agent put is taken back (qrls) so the job, which
    keeps running and whose pilot resumes its VM, is not stranded; the log says why."""
    _cluster, standins, agent, store, pilots = scene
    standins.script("qrerun", stderr="qrerun: Job not rerunnable\n", exit=1)
    first, second = _saving_pilots(standins, pilots, tmp_path, [])
    with structlog.testing.capture_logs() as logs, first, second:
        report = agent.tick()
    assert report.checkpointed == []
    calls = _rms_calls(standins, 0)
    assert len(calls) == 3, calls
    victim = calls[0][-1]
    assert calls == [["qhold", "-h", "u", victim], ["qrerun", victim], ["qrls", "-h", "u", victim]]
    assert store_jobs.get(store, "pbs", victim).preempted_since is None  # not counted as preempted
    assert journal.recent(store, limit=1)[0].state == "failed"  # the switch journalled as failed
    errors = [e for e in logs if e.get("log_level") == "error" and "requeue-hold failed" in e["event"]]
    assert [e["jobs"] for e in errors] == [[victim]], logs
    assert "not rerunnable" in errors[0]["error"]
    taken_back = [e for e in logs if e["event"] == "qrerun failed; the hold is taken back"]
    assert [e["jobs"] for e in taken_back] == [[victim]]

    # the job still runs under PBS (state R, no hold); its pilot resumed the VM, and the next
    # tick may choose it again: nothing was lost
    pilots[victim].write_state(pilots[victim].read_state().moved(PilotState.RUNNING))
    standins.script("qrerun")
    mark = len(standins.calls())
    first, second = _saving_pilots(standins, pilots, tmp_path, [])
    with first, second:
        report = agent.tick()
    assert len(report.checkpointed) == 1
    (again,) = report.checkpointed
    assert _rms_calls(standins, mark) == [["qhold", "-h", "u", again], ["qrerun", again]]
