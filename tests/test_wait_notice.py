"""The agent's step that tells a held-back interactive user why (agent/wait_notice.py) and the
PBS side of it (`PbsAdapter.tell_wait`, on the recorded-output stand-ins).

The step is driven here by real passes (`tick.decide`) over hand-made clusters, against an RMS
kept in memory whose field is edited by the real vjob.record_text, so that what is counted is
the step's writes: one per change, none while the reason stands, one to remove it when the job
starts. The live proof on Slurm (scontrol, squeue -O admin_comment, the user's --comment) is
tests/test_wait_notice_slurm.py; PBS cannot run here (docs/pbs.md), so its commands are checked
on the stand-ins (tests/pbs_standins.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from agent.metrics import AgentMetrics
from agent.wait_notice import WaitNotices
from plugins.pbs import PbsAdapter
from plugins.pbs.config import PbsConfig
from preemption.scheduling.tick import decide
from tests.pbs_standins import StandIns
from vjob import log, record_text
from vjob.config import Config, PriorityConfig, SchedulingConfig
from vjob.errors import CommandError
from vjob.model import ClusterView, Job, JobClass, JobState, Node
from vjob.rms import Abilities, JobEnvironment

NOW = 1_000_000.0
LABEL = "vjob:class=interactive,os=debian12  ops:\tkeep"


class FieldRMS:
    """An RMS reduced to one writable field per job: what `tell_wait` changes, and how often."""

    name = "memory"

    def __init__(self, texts: dict[str, str], wait_field: str | None = "AdminComment") -> None:
        env = JobEnvironment(job_id="J", node_name="N", node_list="L")
        self.abilities = Abilities(None, False, False, False, False, False, env, wait_field=wait_field)
        self.texts = texts
        self.calls: list[str] = []
        self.fail = False

    def tell_wait(self, job_id: str, reason: str | None) -> bool:
        self.calls.append(job_id)
        if self.fail:
            raise CommandError(["scontrol"], "slurmctld not responding", job=job_id)
        new = record_text.with_notice(self.texts[job_id], reason)
        changed, self.texts[job_id] = new != self.texts[job_id], new
        return changed


def _view(interactive: Job, n: int = 2) -> ClusterView:
    batch = [
        Job(
            id=f"b{i}",
            user="alice",
            nodes=1,
            submit_time=NOW - 900,
            start_time=NOW - 60,
            walltime=3600.0,
            state=JobState.RUNNING,
            allocated_nodes=(f"n{i}",),
        )
        for i in range(n)
    ]
    nodes = tuple(Node(f"n{i}", cpus=1, memory_mb=4096) for i in range(n))
    return ClusterView(now=NOW, nodes=nodes, jobs=(*batch, interactive))


def _cfg(cap: float) -> Config:
    return Config(priority=PriorityConfig(interactive_cap=cap), scheduling=SchedulingConfig(policy="vjob"))


def test_written_once_per_change_and_removed_when_the_job_starts(tmp_path: Path) -> None:
    job = Job(id="7", user="bob", job_class=JobClass.INTERACTIVE, submit_time=NOW - 5, walltime=600.0)
    rms = FieldRMS({"7": LABEL})
    notices = WaitNotices(tmp_path / "waiting.json")
    args = (log.get("test"), AgentMetrics())
    view = _view(job)
    for _ in range(3):  # no victim (none is checkpointable): told once, not each tick
        notices.update(rms, decide(view, _cfg(1.0), knob=None, checkpointable=set(), sleeping={}), view, *args)
    assert rms.calls == ["7"] and notices.writes == 1
    assert rms.texts["7"] == LABEL + " [vjob: no checkpointable victim (can free 0 of 1 nodes)]"
    assert json.loads((tmp_path / "waiting.json").read_text())["jobs"] == {
        "7": "vjob: no checkpointable victim (can free 0 of 1 nodes)"
    }
    for _ in range(2):  # the cap now: the new reason replaces the old one in place, once
        notices.update(rms, decide(view, _cfg(0.0), knob=None, checkpointable=set(), sleeping={}), view, *args)
    assert notices.writes == 2
    assert rms.texts["7"] == LABEL + " [vjob: interactive cap reached (0/0 nodes; this job asks 1)]"
    started = replace(view, jobs=(*view.jobs[:-1], replace(job, state=JobState.RUNNING, allocated_nodes=("n0",))))
    for _ in range(2):
        notices.update(rms, decide(started, _cfg(0.0), knob=None, checkpointable=set(), sleeping={}), started, *args)
    assert rms.texts["7"] == LABEL  # every other character as it was
    assert notices.writes == 3 and len(rms.calls) == 3
    assert json.loads((tmp_path / "waiting.json").read_text())["jobs"] == {}


def test_a_failed_write_is_tried_again_and_a_job_gone_is_forgotten() -> None:
    job = Job(id="8", user="bob", job_class=JobClass.INTERACTIVE, submit_time=NOW - 5)
    rms = FieldRMS({"8": ""})
    notices, args = WaitNotices(), (log.get("test"), AgentMetrics())
    view = _view(job)
    decision = decide(view, _cfg(1.0), knob=None, checkpointable=set(), sleeping={})
    rms.fail = True
    notices.update(rms, decision, view, *args)
    assert notices.told == {} and rms.texts["8"] == ""
    rms.fail = False
    notices.update(rms, decision, view, *args)
    assert notices.told == {"8": decision.waits["8"].text()} and rms.texts["8"].startswith("[vjob: ")
    gone = replace(view, jobs=view.jobs[:-1])
    notices.update(rms, decide(gone, _cfg(1.0), knob=None, checkpointable=set(), sleeping={}), gone, *args)
    assert notices.told == {} and len(rms.calls) == 2  # no write for a job the RMS no longer lists


def test_an_rms_without_a_field_is_never_asked() -> None:
    job = Job(id="9", user="bob", job_class=JobClass.INTERACTIVE, submit_time=NOW - 5)
    rms = FieldRMS({"9": ""}, wait_field=None)
    notices = WaitNotices()
    view = _view(job)
    notices.update(rms, decide(view, _cfg(1.0), knob=None, checkpointable=set(), sleeping={}), view, log.get("t"), None)
    assert rms.calls == [] and "9" in notices.told


# -- PBS: the job's `comment`, on the stand-ins ----------------------------------------------------
@pytest.fixture
def standins(tmp_path: Path) -> StandIns:
    return StandIns(tmp_path / "bin")


def test_openpbs_comment_keeps_the_schedulers_text(standins: StandIns, shared_dir: Path) -> None:
    recorded = shared_dir / "data" / "fixtures" / "openpbs" / "metacentrum_pbspro19_qstat_xf_F_json.json"
    doc = json.loads(recorded.read_text())
    (job_id,) = doc["Jobs"]
    original = doc["Jobs"][job_id]["comment"]
    standins.script("qstat", stdout_file=recorded)
    pbs = PbsAdapter(PbsConfig(bin_dir=str(standins.dir), dialect="openpbs"))
    assert pbs.abilities.wait_field == "comment"
    assert pbs.tell_wait(job_id, "vjob: would delay job 41[2].srv by 12 min") is True
    qstat, qalter = standins.calls()
    assert qstat == ["qstat", "-f", "-F", "json", job_id]
    assert qalter == ["qalter", "-W", f'comment="{original} [vjob: would delay job 41(2).srv by 12 min]"', job_id]
    _qstat_prints(standins, doc, job_id, f"{original} [vjob: would delay job 41(2).srv by 12 min]")
    assert pbs.tell_wait(job_id, "vjob: would delay job 41[2].srv by 12 min") is False  # said already
    assert pbs.tell_wait(job_id, None) is True
    assert standins.calls()[-1] == ["qalter", "-W", f'comment="{original}"', job_id]


def _qstat_prints(standins: StandIns, doc: dict, job_id: str, comment: str) -> None:
    """Let the stand-in qstat print `doc` with the job's comment set to `comment`."""
    doc = json.loads(json.dumps(doc))
    doc["Jobs"][job_id]["comment"] = comment
    path = standins.dir / "qstat-told.json"
    path.write_text(json.dumps(doc))
    standins.script("qstat", stdout_file=path)


def test_torque_comment_from_qstat_f_text(standins: StandIns, shared_dir: Path) -> None:
    lines = (shared_dir / "data" / "fixtures" / "torque" / "vsc_qstat_full.txt").read_text().splitlines()
    first = "\n".join(lines[: next(i for i, line in enumerate(lines[1:], 1) if line.startswith("Job Id:"))])
    standins.script("qstat", stdout=first + "\n")
    pbs = PbsAdapter(PbsConfig(bin_dir=str(standins.dir), dialect="torque"))
    assert pbs.tell_wait("20025307.icts-p-svcs-1", "vjob: interactive cap reached (2/2 nodes; this job asks 1)")
    assert standins.calls() == [
        ["qstat", "-f", "20025307.icts-p-svcs-1"],
        [
            "qalter",
            "-W",
            'comment="[vjob: interactive cap reached (2/2 nodes; this job asks 1)]"',
            "20025307.icts-p-svcs-1",
        ],
    ]


def test_a_reason_an_earlier_agent_left_is_removed_once() -> None:
    """A restarted agent (or a new lease holder) does not know what the one before it wrote:
    its first tick looks at every pending or running interactive job not held back now."""
    running = Job(
        id="5",
        user="bob",
        job_class=JobClass.INTERACTIVE,
        submit_time=NOW - 50,
        start_time=NOW - 10,
        state=JobState.RUNNING,
        allocated_nodes=("n0",),
    )
    view = replace(
        _view(running),
        jobs=(
            running,
            Job(id="b1", user="alice", state=JobState.RUNNING, allocated_nodes=("n1",), start_time=NOW - 60),
        ),
    )
    rms = FieldRMS({"5": LABEL + " [vjob: interactive cap reached (0/0 nodes; this job asks 1)]"})
    notices, args = WaitNotices(), (log.get("test"), AgentMetrics())
    for _ in range(3):
        notices.update(rms, decide(view, _cfg(1.0), knob=None, checkpointable=set(), sleeping={}), view, *args)
    assert rms.texts["5"] == LABEL and rms.calls == ["5"] and notices.writes == 1


def test_a_reason_another_writer_dropped_is_back_within_resync_s() -> None:
    """An operator's `scontrol update AdminComment=...` replaces the whole field, dropping vjob's
    group: the next reading (every resync_s) finds it missing and adds it back beside the
    operator's words; between readings a steady reason costs no call, and a reading that finds
    the reason in place writes nothing."""
    job = Job(id="6", user="bob", job_class=JobClass.INTERACTIVE, submit_time=NOW - 5)
    rms = FieldRMS({"6": LABEL})
    clock = [0.0]
    notices, args = WaitNotices(resync_s=300.0, clock=lambda: clock[0]), (log.get("test"), AgentMetrics())
    view = _view(job)
    decision = decide(view, _cfg(1.0), knob=None, checkpointable=set(), sleeping={})
    group = f"[{decision.waits['6'].text()}]"
    notices.update(rms, decision, view, *args)
    assert rms.texts["6"] == f"{LABEL} {group}" and notices.writes == 1
    rms.texts["6"] = "ops: node n0 drained\ttill noon"  # the operator's write, whole
    for t in (10.0, 150.0, 299.0):
        clock[0] = t
        notices.update(rms, decision, view, *args)
    assert len(rms.calls) == 1  # trusted between readings
    clock[0] = 300.0
    notices.update(rms, decision, view, *args)
    assert rms.texts["6"] == f"ops: node n0 drained\ttill noon {group}" and notices.writes == 2
    clock[0] = 600.0
    notices.update(rms, decision, view, *args)
    assert len(rms.calls) == 3 and notices.writes == 2  # read again, found in place: no write
