"""What root does with what users wrote, issue 39 follow-ups: `vjob status` hears pilot
directories by the agent's owner rule, the control loop weighs a VM by what root knows (never by
its pilot's claim) and orders the vjobs the RMS does not list last, and withdrawing a request
never follows a directory swapped for a link.

Real components: files and directories with real owners (the tests run as root and chown to
`daemon` and `nobody`), a real SQLite store, the agent's own control step and `vjob status`'s
collect(); only libvirt's domain statistics are given by a stand-in sampler, as in
tests/test_agent_status.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import consolidate
from agent.consolidate import ControlState, observed_vms
from agent.loop import Agent
from agent.metrics import AgentMetrics
from agent.observe import Observation
from agent.status_cmd import collect
from provisioning.profiling import DomainSample
from tests.agent_steps import control_step
from vjob.config import Config
from vjob.config import load as load_config_file
from vjob.model import ClusterView, Job, Node, VJobState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
from vjob.store import jobs as store_jobs
from vjob.store.db import Store

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: directories owned by other users")

DAEMON, NOBODY = 1, 65534


def _state(job: str, node: str, **changes: object) -> PilotStatus:
    base = PilotStatus(
        job_id=job, vm=f"vjob-slurm-{job}", node=node, uri="test:///default", state=PilotState.RUNNING, since=1.0
    )
    return PilotStatus(**(base.to_json() | {"state": base.state} | changes))


def _dir(root: Path, name: str, uid: int, st: PilotStatus) -> Path:
    """A pilot directory `name` owned by `uid` holding the state `st`, as that user's pilot
    would leave it."""
    path = root / name
    path.mkdir(mode=0o700)
    (path / "state.json").write_text(json.dumps(st.to_json()))
    for p in (path, path / "state.json"):
        os.chown(p, uid, uid)
    return path


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Config, Store, Path]]:
    """A data directory, its SQLite store and the pilot root (1777, as deployed)."""
    config = tmp_path / "vjob.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n[planner]\ninterval_s = 30\noptimizer = "ffd"\n')
    cfg = load_config_file(config)
    store = Store(f"sqlite:///{tmp_path / 'data' / 'vjob.sqlite'}")
    store.upgrade()
    root = tmp_path / "data" / "pilots"
    root.mkdir(parents=True)
    root.chmod(0o1777)
    yield cfg, store, root
    store.close()


# -- 1: `vjob status` hears a directory by the agent's owner rule -------------------------------


def test_status_never_shows_a_squatters_forged_row(site: tuple[Config, Store, Path]) -> None:
    """`nobody` squats `slurm-8` and writes a state claiming job 8 saved on node `evil`; job 8's
    pilot (as `daemon`, its user in the store) works in its keyed directory. `nobody` also
    writes a row for job 9, which neither the RMS nor the store knows. Status listed all three;
    it now shows job 8 from daemon's directory only, and job 10 from root's, as the agent hears
    them (agent.observe.hear)."""
    cfg, store, root = site
    store_jobs.track(store, Job(id="8", user="daemon", rms="slurm"))
    _dir(root, "slurm-8", NOBODY, _state("8", "evil", state=PilotState.SAVED, saved_node="evil"))
    _dir(root, "slurm-8~0123456789abcdef", DAEMON, _state("8", "node1"))
    _dir(root, "slurm-9", NOBODY, _state("9", "evil"))
    _dir(root, "slurm-10", 0, _state("10", "node2"))

    data = collect(cfg, "slurm")
    assert sorted((v["job"], v["node"], v["pilot"]) for v in data["vjobs"]) == [
        ("10", "node2", "running"),
        ("8", "node1", "running"),
    ]
    refused = [e for e in data["errors"] if "the agent ignores this state" in e]
    assert any("slurm-8:" in e and f"uid {NOBODY}" in e for e in refused)
    assert any("slurm-9:" in e for e in refused)


# -- 2: the control loop weighs what root knows, and unknown vjobs come last ---------------------


def _agent(cfg: Config, store: Store) -> Agent:
    class _NoRMS:
        name = "slurm"

        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the control step called the adapter's {name}")

    agent = Agent(cfg, _NoRMS(), rms="slurm", metrics=AgentMetrics())  # type: ignore[arg-type]
    agent.ports.store.opened = store
    return agent


def _sampler(mib: dict[str, int]) -> consolidate.Sampler:
    """libvirt's view of node n1: each VM there and the MiB it holds."""
    return lambda node: {vm: DomainSample(vm, 0.0, 0, 1, memory_kib=m * 1024) for vm, m in mib.items()}


@pytest.mark.parametrize(("claim_mib", "claim_vcpus"), [(4000, 2), (60000, 64)])
def test_a_pilots_claimed_size_never_weighs_an_unmeasured_vm(
    site: tuple[Config, Store, Path], claim_mib: int, claim_vcpus: int
) -> None:
    """Job 5 (submitted first, 512 MiB and 1 CPU from the RMS) has a pilot that names node n1 and
    claims a VM of `claim_mib` MiB and `claim_vcpus` vCPUs; root does not find its VM there. Job
    6 (bob) runs on n1, 3000 MiB measured. The loop weighed 5 at its claim: n1 overloaded, FCFS
    kept 5 and suspended 6 (and a claim larger than any node made every step fail). Now 5 weighs
    what the RMS allocated: both fit, nothing is planned."""
    cfg, store, _root = site
    agent = _agent(cfg, store)
    state = ControlState(sampler=_sampler({"vjob-slurm-6": 3000}))
    pilots = {"5": _state("5", "n1", memory_mb=claim_mib, vcpus=claim_vcpus), "6": _state("6", "n1")}
    jobs = (
        Job(id="5", user="mallory", rms="slurm", submit_time=1.0, memory_mb=512, cores=1),
        Job(id="6", user="bob", rms="slurm", submit_time=2.0, memory_mb=3072, cores=1),
    )
    view = ClusterView(now=0, nodes=(Node("n1", 2, 4096),), jobs=jobs)
    assert control_step(agent.ports, Observation(view, pilots, {}, True), state) is None
    assert state.decision is not None and state.decision.overloaded == ()
    assert state.decision.selection.target == {"5": VJobState.RUNNING, "6": VJobState.RUNNING}
    assert state.unmeasured == ("vjob-slurm-5",)


def test_a_small_claim_never_makes_an_unmeasured_vm_weigh_less_than_root_knows() -> None:
    """The other way round: a pilot claiming 1 MiB and 1 vCPU for a VM root cannot find weighs
    the RMS's 3072 MiB and 2 CPUs (or what root last measured, if more); with no memory asked of
    the RMS, its CPUs' share of the node's; a running VM root measures weighs the measure."""
    state = ControlState(sampler=_sampler({"vjob-slurm-7": 100}))
    pilots = {j: _state(j, "n1", memory_mb=1, vcpus=1) for j in ("1", "2", "7")}
    jobs = (
        Job(id="1", user="a", rms="slurm", memory_mb=3072, cores=2),
        Job(id="2", user="b", rms="slurm", memory_mb=0),
        Job(id="7", user="c", rms="slurm", memory_mb=3072),
    )
    view = ClusterView(now=0, nodes=(Node("n1", 4, 8192),), jobs=jobs)
    got = {
        o.vjob: (o.mem, o.vcpus, o.demand) for o in observed_vms(Observation(view, pilots, {}, True), state, busy=0.5)
    }
    assert got == {"1": (3072, 2, 2), "2": (2048, 1, 1), "7": (100, 1, 1)}
    state.memory["vjob-slurm-1"] = 5000  # root measured more before losing sight of it
    (one,) = [o for o in observed_vms(Observation(view, pilots, {}, True), state, busy=0.5) if o.vjob == "1"]
    assert one.mem == 5000


def test_a_vjob_the_rms_does_not_list_never_comes_before_one_it_does(site: tuple[Config, Store, Path]) -> None:
    """A directory of job id 0 (root's, nothing the RMS lists) and job 3 (the RMS forgot it; the
    store recorded 700 MiB) beside job 5 (submitted at 100) on a 1 GiB node, each measured 700
    MiB. The unknown id sorted first (submitted "at 0") and 5 was suspended; now 5 runs and the
    unknown vjobs give way, weighed at what root knows (the store's record for 3)."""
    cfg, store, _root = site
    store_jobs.track(store, Job(id="3", user="daemon", rms="slurm", memory_mb=700))
    agent = _agent(cfg, store)
    mib = {f"vjob-slurm-{j}": 700 for j in ("0", "3", "5")}
    state = ControlState(sampler=_sampler(mib))
    pilots = {j: _state(j, "n1") for j in ("0", "3", "5")}
    view = ClusterView(
        now=0, nodes=(Node("n1", 4, 1024),), jobs=(Job(id="5", user="bob", rms="slurm", submit_time=100.0),)
    )
    report = control_step(agent.ports, Observation(view, pilots, {}, True), state)
    assert report is not None  # the suspends fail: no pilot runs here to answer them
    assert state.decision is not None
    assert state.decision.selection.target == {"5": VJobState.RUNNING, "0": VJobState.SLEEPING, "3": VJobState.SLEEPING}
    assert consolidate.fcfs_queue(Observation(view, pilots, {}, True), pilots) == ["5", "0", "3"]
    assert state.plan is not None and sorted(a.vm for a in state.plan.actions) == ["vjob-slurm-0", "vjob-slurm-3"]


# -- 4: withdrawing a request never follows a swapped directory ----------------------------------


def test_withdrawing_a_request_never_deletes_through_a_swapped_directory(tmp_path: Path) -> None:
    """`nobody` owns job 5's directory; after the agent's request it renames it away and puts a
    link to job 6's directory (daemon's, with the agent's request for 6) in its place. Root's
    withdrawal for job 5 unlinked by path and removed job 6's request; now it opens the
    directory with O_NOFOLLOW, refuses the link, and 6's request stays. A plain directory
    somebody else owns is refused the same way; the job's own loses its request."""
    root = tmp_path / "pilots"
    root.mkdir()
    root.chmod(0o1777)
    five, six = (PilotDir(root, "slurm", j, owners=(uid, 0)) for j, uid in (("5", NOBODY), ("6", DAEMON)))
    for pdir, uid in ((five, NOBODY), (six, DAEMON)):
        pdir.path.mkdir(mode=0o700)
        os.chown(pdir.path, uid, uid)
        pdir.request_checkpoint(f"r{pdir.job_id}")
    five.path.rename(root / "slurm-5.away")
    five.path.symlink_to(six.path)

    refused = five.withdraw_request()
    assert six.request_file.exists() and json.loads(six.request_file.read_text())["request_id"] == "r6"
    assert refused is False

    five.path.unlink()
    (root / "slurm-5.away").rename(five.path)
    os.chown(five.path, DAEMON, DAEMON)  # now somebody else's plain directory
    assert five.withdraw_request() is False and five.request_file.exists()

    assert six.withdraw_request() is True and not six.request_file.exists()
    assert six.withdraw_request() is True  # nothing left to withdraw: done
    assert PilotDir(root, "slurm", "77").withdraw_request() is True  # no directory at all


def test_the_agent_withdraws_only_where_it_heard_the_job(site: tuple[Config, Store, Path]) -> None:
    """The directory the agent heard a job from carries the owner it was heard by: a withdrawal
    after the job's user swapped another user's directory (here a plain one) in is refused."""
    from agent.observe import hear  # here: the item-1 helper, so the other tests run on older code too

    _cfg, _store, root = site

    _dir(root, "slurm-8", DAEMON, _state("8", "node1"))
    heard, _ = hear([PilotDir(root, "slurm", "8")], {"8": "daemon"})
    (pdir, _st) = heard["8"]
    assert pdir.owners == (DAEMON, 0)
    pdir.request_checkpoint("r8")
    os.chown(pdir.path, NOBODY, NOBODY)
    assert pdir.withdraw_request() is False and pdir.request_file.exists()
