"""Live context switches on real QEMU guests: how long each kind of plan action takes.

Two libvirtds on this machine act as two nodes (a: the system libvirtd, b: a second libvirtd
in its own namespace, devkit.libvirtd); every vjob is a real pilot process (`vjob run`, the
counter guest under TCG) and every action is a one-action plan carried out by the agent's
executor through the pilots (agent.pilot_performer) and journalled in a SQLite store. The
time of an action is the journal's (started_at → finished_at): what a switch pays for it.
Per repetition, one vjob goes through: run on a (the pilot boots the VM), suspend on a, local
resume on a, live migration a → b, suspend on b, remote resume on a (state copied from b),
stop. Last line: JSON.

    .venv/bin/python bench/planner_live.py [--repetitions 3] [--memory 96]

`--experiment`: the paper's cluster experiment scaled to this machine. Each node is declared
one CPU (the machine has two cores); `--vjobs` vjobs of `--vms` guests each run a real CPU
payload of `--stages` stages, computing (`--iterations` steps of shell arithmetic) and idle
(`--idle` seconds) in turn. The same control loop (FCFS decision over the queue, the planner,
the executor through the pilots) runs the set twice: once weighing every VM by its requested
CPU (FCFS as a static scheduler books it: a waiting vjob starts when a finished one frees its
CPUs), once by the demand root measures through libvirt, as the agent's loop does
(agent.consolidate: time used plus time waited for a host CPU; Entropy: idle VMs make room, overloaded nodes
are relieved by migration or suspension). The figure is the completion time of the set.

    .venv/bin/python bench/planner_live.py --experiment [--vjobs 3] [--stages 4] [--iterations 200000]

`--program mpi-ring` (with `--vms 2`): each vjob is instead one real multi-node pilot (`vjob run
--nodes a,b`: one VM on each libvirtd, a private network between them) of the default image
`debian12` (Open MPI and mpi4py are in it; bench/multinode_mpi.IMAGE), running bench/multinode_mpi.py's MPI ring with
its stages: every round, each rank computes `--work` steps of Python arithmetic (`C`) or sleeps
`--idle` seconds (`I`), then the counter goes round the ring. The loop observes the pilots as
the agent does (agent.consolidate.observed_vms: each VM sampled on its node, the vjob's VMs
pinned), so it can only run, suspend and resume a vjob whole, in place (agent.pilot_coalesce);
every ring must end with the counter an uninterrupted run gives.

    nice -n 10 .venv/bin/python bench/planner_live.py --experiment --program mpi-ring --vms 2 --memory 384 \
        --node-memory 4096 --vjobs 3 --stages 3 --workload alternating --work 1000000 --idle 150

`LiveSite` (the configuration of the two nodes, the pilots, the store, the clean-up) is also
what tests/test_planner_realvm.py runs its plan on.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from agent import consolidate
from agent.observe import Observation
from agent.pilot_coalesce import coalesce
from agent.pilot_performer import EXECUTOR_TAG, PilotRequestPerformer
from devkit import guest_probe, libvirtd
from preemption.executor import ExecutionReport, Executor
from preemption.planner import NodeSpec, Plan, PlanAction, control
from preemption.planner.control import ObservedVM
from provisioning import guest, image_build
from provisioning.driver import Driver
from provisioning.images import Catalogue
from provisioning.profiling import DomainSample, node_sampler
from vjob import config as vconfig
from vjob.errors import VjobError
from vjob.model import Action, ClusterView, Job, VJobState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus, RequestKind, member_names, vm_name
from vjob.progress import Progress
from vjob.store import journal
from vjob.store.db import Store

REPO = Path(__file__).resolve().parents[1]


def _bench_module(name: str) -> ModuleType:
    """Another bench script (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mpi = _bench_module("multinode_mpi")
"""The MPI ring, its job script, the site image with Open MPI and a job's clean-up."""
NODES = ("a", "b")
RMS = "slurm"
KINDS = ("run", "suspend", "local resume", "migrate", "remote resume", "stop")


class MpiScript(NamedTuple):
    """A multi-node job's script: its directory (job.sh, ring.py) and its arguments."""

    cwd: Path
    args: tuple[str, ...]


class LiveSite:
    """Two real nodes, the vjobs' pilots on them, and the store the executor journals into.

    The VMs' directory is one path for both nodes (a live migration needs the overlay at the
    same path), the memory states one directory per node (a resume elsewhere really copies).
    """

    def __init__(self, uris: dict[str, str], *, memory_mib: int = 96, prefix: str = "vjob-plan-live-") -> None:
        self.work = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
        self.work.chmod(0o711)  # QEMU runs as libvirt-qemu and must reach the overlays below
        self.data = self.work / "data"
        self.memory_mib = memory_mib
        nodes = "".join(f'{n} = "{u}"\n' for n, u in uris.items())
        migrate = "".join(f'{n} = "tcp://127.0.0.1"\n' for n in uris)
        self.config = self.work / "vjob.toml"
        self.config.write_text(
            f'data_dir = "{self.data}"\n[provisioning]\noperation_timeout_s = 120.0\n'
            f'snapshot_dir = "{self.data / "snapshots" / "{node}"}"\n'
            f"[provisioning.nodes]\n{nodes}[provisioning.migrate_uris]\n{migrate}"
        )
        cfg = vconfig.load(self.config)
        self.store = Store(cfg.database_url)
        self.store.upgrade()
        self.driver = Driver(cfg.provisioning, data_dir=cfg.data_path)
        self.nodes = tuple(uris)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.multi: set[str] = set()
        """The multi-node jobs started (their VMs `<vm>-<rank>` and bridge to clean up)."""

    # -- pilots ------------------------------------------------------------------------------
    def pilot(
        self,
        job: str,
        node: str,
        payload: Path | None = None,
        *,
        script: MpiScript | None = None,
        nodes: tuple[str, ...] = (),
    ) -> subprocess.Popen[bytes]:
        """Start vjob `job`'s pilot on `node` (what the RMS does when the job starts there);
        the guest runs `payload` (a shell script) instead of its counter when given. With
        `script` and several `nodes`: a multi-node pilot of a catalogue image, one VM per node,
        running the script unchanged from its directory."""
        for n in self.nodes:  # a VM of that name left by an earlier run would be adopted
            self.driver.delete(vm_name(RMS, job), n)
        cmd = [
            sys.executable,
            "-m",
            "vjob.cli",
            "--config",
            str(self.config),
            "run",
            "--job-id",
            job,
            "--node",
            node,
            "--memory",
            str(self.memory_mib),
        ]
        cmd += ["--payload", str(payload)] if payload else []
        cwd = REPO
        if script is not None:
            self.multi.add(job)
            mpi.forget_job(self.driver, job, self.nodes, len(nodes))
            cmd += ["--nodes", ",".join(nodes), "--os", mpi.IMAGE, "--script", "job.sh", "--", *script.args]
            cwd = script.cwd
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        with open(self.work / f"pilot-{job}.out", "ab") as out:
            proc = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.procs[job] = proc
        return proc

    def pdir(self, job: str) -> PilotDir:
        return PilotDir(self.data / "pilots", RMS, job)

    def state(self, job: str) -> PilotStatus:
        try:
            st = self.pdir(job).read_state() if self.pdir(job).exists() else None
        except VjobError:
            st = None  # being rewritten
        if st is None:
            raise VjobError(f"vjob {job}: its pilot wrote no state yet")
        return st

    def console(self, job: str) -> Path:
        return self.driver.console_log(vm_name(RMS, job), self.nodes[0])  # one VM directory for all nodes

    def wait(self, what: str, ok: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if ok():
                    return
            except VjobError:
                pass
            time.sleep(0.1)
        raise VjobError(f"{what}: not within {timeout_s:.0f} s; pilot logs in {self.work}")

    def wait_counting(self, job: str, at_least: int = 2, timeout_s: float = 120.0) -> int:
        """Until the guest of `job` runs and prints `COUNTER at_least` (booted, counting)."""
        self.wait(f"pilot {job} running", lambda: self.state(job).state is PilotState.RUNNING, timeout_s)
        return guest_probe.wait_for_counter(self.console(job), at_least, timeout_s)

    def asleep(self, job: str, timeout_s: float = 120.0) -> None:
        """Put vjob `job` to sleep through its pilot (the state an earlier switch leaves)."""
        pdir = self.pdir(job)
        pdir.request(RequestKind.SUSPEND, f"setup-{job}")
        self.wait(f"pilot {job} asleep", lambda: pdir.answer_to(f"setup-{job}") is not None, timeout_s)

    # -- executor ----------------------------------------------------------------------------
    def performer(self, timeout_s: float = 120.0) -> PilotRequestPerformer:
        def start_job(action: PlanAction) -> None:  # the RMS starts the job on the planned node
            assert action.dst is not None
            self.pilot(action.vjob, action.dst)

        return PilotRequestPerformer(lambda a: self.pdir(a.vjob), timeout_s=timeout_s, start_job=start_job)

    def executor(self) -> Executor:
        return Executor(
            self.performer(), self.store, pipeline_interval_s=0.1, tag=EXECUTOR_TAG, job_key=lambda a: f"{RMS}:{a.vjob}"
        )

    def close(self) -> None:
        """Pilots killed outright (a SIGTERM would save every VM first), then every VM deleted."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        for job in self.procs:
            for node in self.nodes:
                try:
                    self.driver.delete(vm_name(RMS, job), node)
                    if job in self.multi:
                        mpi.forget_job(self.driver, job, (node,), 2)
                except VjobError:
                    pass  # gone with its node: nothing left to delete there
        self.driver.close()
        self.store.close()
        shutil.rmtree(self.work, ignore_errors=True)


def one_action(kind: Action, job: str, src: str | None, dst: str | None) -> Plan:
    vm = vm_name(RMS, job)
    placement = {vm: dst} if kind in (Action.RUN, Action.RESUME, Action.MIGRATE) and dst else {}
    return Plan(pools=((PlanAction(kind, vm, job, src, dst),),), placement=placement, cost=0)


def timed(site: LiveSite, plan: Plan) -> float:
    """Carry out a one-action plan; its duration as the journal recorded it."""
    report: ExecutionReport = site.executor().execute(plan, reason="bench planner_live")
    if report.state != "done":
        raise VjobError(f"bench: {report.summary()}")
    ((start, end, _err),) = journal.action_times(site.store, report.switch_id).values()
    assert start is not None and end is not None
    return end - start


def repetition(site: LiveSite, job: str) -> dict[str, float]:
    """One vjob through every action kind; the guest must have kept counting (one boot)."""
    out: dict[str, float] = {}
    out["run"] = timed(site, one_action(Action.RUN, job, None, "a"))
    site.wait_counting(job)
    out["suspend"] = timed(site, one_action(Action.SUSPEND, job, "a", None))
    out["local resume"] = timed(site, one_action(Action.RESUME, job, "a", "a"))
    out["migrate"] = timed(site, one_action(Action.MIGRATE, job, "a", "b"))
    site.wait_counting(job, (guest_probe.last_counter(site.console(job)) or 0) + 1)
    timed(site, one_action(Action.SUSPEND, job, "b", None))
    out["remote resume"] = timed(site, one_action(Action.RESUME, job, "b", "a"))
    last = site.wait_counting(job, (guest_probe.last_counter(site.console(job)) or 0) + 1)
    seen = guest_probe.counters(site.console(job))
    if seen != list(range(1, len(seen) + 1)) or guest_probe.boots(site.console(job)) != 1:
        raise VjobError(f"vjob {job}: the guest did not continue across the switches: {seen}")
    out["stop"] = timed(site, one_action(Action.STOP, job, "a", None))
    out["counter"] = float(last)
    return out


# -- the cluster experiment, scaled to this machine ------------------------------------------
STAGE = """i=0
while [ $i -lt {n} ]; do i=$((i+1)); s=$(( (i*31 + 7) % 1000003 )); done
"""
IDLE = "sleep {s}\n"


def stage_payload(pattern: str, iterations: int, idle_s: int) -> str:
    """A VM's program: `C` computes `iterations` steps of arithmetic (real CPU work, slower
    when it shares a core), `I` waits `idle_s` seconds (a VM waiting on its neighbours)."""
    body = "".join(STAGE.format(n=iterations) if c == "C" else IDLE.format(s=idle_s) for c in pattern)
    return body + 'echo "STAGES DONE"\n'


class Workload:
    """`vjobs` vjobs of `vms` VMs each, all submitted at once (the queue in id order), each VM
    computing and idle in stages: `alternating` (every other VM starting with an idle stage:
    two VMs can share a CPU without ever competing) or `random` (stages and idle lengths drawn
    from `seed`: phases overlap and nodes get overloaded)."""

    def __init__(self, site: LiveSite, tag: str, args: argparse.Namespace) -> None:
        self.site = site
        self.queue = [f"v{k}" for k in range(args.vjobs)]
        self.jobs: dict[str, tuple[str, str]] = {}
        self.payload: dict[str, Path] = {}
        alternating = ("CI" * args.stages)[: args.stages], ("IC" * args.stages)[: args.stages]
        rng = random.Random(args.seed)  # the same workload for both policies
        for g in range(args.vjobs * args.vms):
            job = f"{tag}{g // args.vms}{g % args.vms}"
            self.jobs[vm_name(RMS, job)] = (f"v{g // args.vms}", job)
            if args.workload == "alternating":
                pattern, idle = alternating[g % 2], args.idle
            else:  # stages drawn at random: phases overlap, nodes get overloaded
                pattern = "C" + "".join(rng.choice("CI") for _ in range(args.stages - 1))
                pattern, idle = (
                    "".join(rng.sample(pattern, len(pattern))),
                    rng.randint(args.idle // 2, args.idle * 3 // 2),
                )
            path = site.work / f"payload-{tag}-{g}.sh"
            path.write_text(stage_payload(pattern, args.iterations, idle))
            self.payload[job] = path
        # Measured as the agent's control loop does (agent.consolidate): root samples libvirt's
        # domain statistics on each node; the pilots' files only say which VMs run where.
        self.sampler = node_sampler(site.driver.connection)
        self.samples: dict[str, DomainSample] = {}
        self.readings: dict[str, tuple[float, float, float]] = {}
        """VM → its last (CPU seconds, seconds its vCPUs waited for a host CPU, at)."""
        self.demand: dict[str, int] = {}
        self.memory: dict[str, int] = {}
        self.memory_seen: list[int] = []
        """Every memory a running VM was measured holding (MiB: its balloon or QEMU's resident set)."""
        self.used: list[float] = []
        """Every share of a core a VM was measured using (the demand's raw readings)."""
        self.wanted: list[float] = []
        """The same readings plus the share its vCPUs waited for a host CPU: what it wanted."""

    def job(self, vm: str) -> str:
        return self.jobs[vm][1]

    def observe(self, measured: bool) -> tuple[list[ObservedVM], bool]:
        """Every VM not finished, weighed by its measured demand and memory (or its requested
        size); True when every VM has finished."""
        out: list[ObservedVM] = []
        running: list[tuple[str, str, PilotStatus]] = []
        for vm, (vjob, job) in self.jobs.items():
            try:
                st = self.site.pdir(job).read_state() if self.site.pdir(job).exists() else None
            except VjobError:  # being rewritten: read again
                time.sleep(0.05)
                st = self.site.pdir(job).read_state()
            if st is not None and st.state is PilotState.FINISHED:
                continue
            if st is None:
                out.append(ObservedVM(vm, vjob, VJobState.WAITING, None, self.site.memory_mib, 1, 1))
            elif st.state is PilotState.SAVED:
                mem = self.memory.get(vm, self.site.memory_mib) if measured else self.site.memory_mib
                out.append(
                    ObservedVM(
                        vm, vjob, VJobState.SLEEPING, st.saved_node, mem, 1, self.demand.get(vm, 1) if measured else 1
                    )
                )
            else:
                running.append((vm, vjob, st))
        on_node: dict[str, Mapping[str, DomainSample]] = {}
        for node in sorted({st.node for _, _, st in running}):
            try:
                on_node[node] = self.sampler(node)
            except VjobError as exc:  # libvirtd restarted under us: its VMs weigh their size this step
                print(f"cannot sample node {node}: {exc}", file=sys.stderr, flush=True)
                on_node[node] = {}
        fresh: dict[str, DomainSample] = {}
        for vm, vjob, st in running:
            sample = on_node[st.node].get(vm)  # None: booting or moving, weighed at its size
            prev = self.samples.get(vm)
            if sample is not None:
                fresh[vm] = sample
                self.demand[vm] = consolidate.vm_demand(sample, prev, busy=0.5)
                self.memory[vm] = consolidate.measured_mib(sample) or self.site.memory_mib
                self.memory_seen.append(self.memory[vm])
                if prev is not None and sample.t > prev.t:
                    dt = sample.t - prev.t
                    used = max(0, sample.cpu_time_ns - prev.cpu_time_ns) / 1e9 / dt
                    waited = max(0, (sample.vcpu_delay_ns or 0) - (prev.vcpu_delay_ns or 0)) / 1e9 / dt
                    self.used.append(used)
                    self.wanted.append(used + waited)
                self.readings[vm] = (sample.cpu_time_ns / 1e9, (sample.vcpu_delay_ns or 0) / 1e9, sample.t)
            demand, mem = 1, self.site.memory_mib
            if measured and sample is not None:
                demand, mem = self.demand[vm], self.memory[vm]
            out.append(ObservedVM(vm, vjob, VJobState.RUNNING, st.node, mem, 1, demand))
        self.samples = fresh
        return out, not out


def experiment(site: LiveSite, tag: str, *, measured: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Run the workload to its end under one policy; the completion time of the set.

    Both policies are the same control loop with the same decision module (FCFS over the
    queue) and planner: `measured=False` weighs each VM by its requested CPU (FCFS as a static
    scheduler books it), `measured=True` by the demand and memory measured through libvirt (Entropy)."""
    work = Workload(site, tag, args)
    nodes = tuple(NodeSpec(n, 1, 1024) for n in site.nodes)
    performer = PilotRequestPerformer(
        lambda a: site.pdir(work.job(a.vm)),
        timeout_s=120,
        start_job=lambda a: site.pilot(work.job(a.vm), a.dst or "", work.payload[work.job(a.vm)]),
    )
    executor = Executor(
        performer, site.store, pipeline_interval_s=0.1, tag=EXECUTOR_TAG, job_key=lambda a: f"{RMS}:{work.job(a.vm)}"
    )
    actions: dict[str, int] = {}
    switches = failed = steps = overloaded = 0
    switch_s = 0.0
    t0 = time.monotonic()
    while True:
        observed, done = work.observe(measured)
        if done:
            break
        if time.monotonic() - t0 > args.horizon:
            raise VjobError(f"experiment {tag}: not finished within {args.horizon} s")
        present = {o.vjob for o in observed}
        decision = control.decide(nodes, observed, [j for j in work.queue if j in present])
        steps += 1
        overloaded += bool(decision.overloaded)
        plan = control.plan_for(decision, optimizer="cpsat", time_limit_s=2.0)
        if plan is not None:
            t1 = time.monotonic()
            report = executor.execute(plan, reason="bench planner_live experiment")
            switch_s += time.monotonic() - t1
            switches += 1
            failed += report.state != "done"
            for a in plan.actions:
                actions[a.kind.value] = actions.get(a.kind.value, 0) + 1
        time.sleep(args.interval)
    return {
        "completion_s": round(time.monotonic() - t0, 1),
        "switches": switches,
        "failed_switches": failed,
        "switch_s": round(switch_s, 1),
        "actions": actions,
        "steps": steps,
        "overloaded_steps": overloaded,
        "busy_readings": sum(u >= 0.5 for u in work.used),
        "readings": len(work.used),
        "starved_readings": sum(u < 0.5 <= w for u, w in zip(work.used, work.wanted, strict=True)),
        "max_core_share": round(max(work.used, default=0.0), 2),
    }


# -- the cluster experiment with multi-node vjobs running an MPI ring -------------------------
def ring_stages(args: argparse.Namespace) -> list[str]:
    """Each vjob's stages (`C` compute, `I` idle), the same for both policies: `alternating`
    starts every other vjob idle; `random` draws them from `seed` (at least one compute)."""
    rng = random.Random(args.seed)
    out = []
    for k in range(args.vjobs):
        if args.workload == "alternating":
            out.append((("CI" if k % 2 == 0 else "IC") * args.stages)[: args.stages])
        else:
            pattern = "C" + "".join(rng.choice("CI") for _ in range(args.stages - 1))
            out.append("".join(rng.sample(pattern, len(pattern))))
    return out


def runs_as_one(plan: Plan, vms: Mapping[str, int]) -> Plan:
    """The runs of a multi-node vjob (one per VM) as one run of its pilot's first VM in the
    last pool that held one of them: the RMS starts the job once, on all its nodes (the
    planner's placement of each VM), and the pilot reports on its first VM's node."""
    last: dict[str, int] = {}
    for i, pool in enumerate(plan.pools):
        for a in pool:
            if a.kind is Action.RUN and vms.get(a.vjob, 1) > 1:
                last[a.vjob] = i
    pools = []
    for i, pool in enumerate(plan.pools):
        kept = [a for a in pool if not (a.kind is Action.RUN and a.vjob in last)]
        for job in (j for j, at in last.items() if at == i):
            leader = member_names(vm_name(RMS, job), vms[job])[0]
            kept.append(PlanAction(Action.RUN, leader, job, None, plan.placement[leader]))
        pools.append(tuple(kept))
    return Plan(tuple(p for p in pools if p), plan.placement, plan.cost, plan.optimizer, plan.warnings, plan.stats)


def mpi_experiment(site: LiveSite, tag: str, *, measured: bool, args: argparse.Namespace) -> dict[str, Any]:
    """The set of `--vjobs` MPI rings, each a multi-node pilot, under one policy (as
    `experiment`: `measured=False` weighs each VM by its requested CPU and memory, True by what
    root measured through libvirt); its completion time and whether every ring ended right."""
    cwd = site.work / f"job-{tag}"
    cwd.mkdir()
    (cwd / "job.sh").write_text(mpi.JOB)
    (cwd / "ring.py").write_text(mpi.RING)
    queue = [f"{tag}{k}" for k in range(args.vjobs)]
    stages = dict(zip(queue, ring_stages(args), strict=True))
    scripts = {j: MpiScript(cwd, (str(len(p)), p, str(args.work), str(args.idle))) for j, p in stages.items()}
    nodes = tuple(NodeSpec(n, 1, args.node_memory) for n in site.nodes)
    vms = dict.fromkeys(queue, args.vms)
    placed: dict[str, str] = {}
    """Where the last plan put each VM: the nodes the RMS starts a job on."""

    def start(a: PlanAction) -> None:
        where = tuple(placed[m] for m in member_names(vm_name(RMS, a.vjob), args.vms))
        site.pilot(a.vjob, where[0], script=scripts[a.vjob], nodes=where)

    performer = PilotRequestPerformer(lambda a: site.pdir(a.vjob), timeout_s=args.action_timeout, start_job=start)
    executor = Executor(
        performer, site.store, pipeline_interval_s=0.1, tag=EXECUTOR_TAG, job_key=lambda a: f"{RMS}:{a.vjob}"
    )
    state = consolidate.ControlState(sampler=node_sampler(site.driver.connection))
    actions: dict[str, int] = {}
    requests: dict[str, int] = {}
    switches: list[dict[str, Any]] = []
    used: list[float] = []
    wanted: list[float] = []
    steps = overloaded = 0
    finished: dict[str, float] = {}
    t0 = time.monotonic()
    while True:
        pilots = {}
        for job in queue:
            try:
                st = site.state(job)
            except VjobError:
                continue  # not started yet (or its state being rewritten: read next step)
            if st.state in (PilotState.FINISHED, PilotState.FAILED):
                finished.setdefault(job, round(time.monotonic() - t0, 1))
            pilots[job] = st
        if len(finished) == len(queue):
            break
        if time.monotonic() - t0 > args.horizon:
            raise VjobError(f"experiment {tag}: not finished within {args.horizon} s")
        before = dict(state.samples)
        # what the RMS allocated each job (per VM): what root weighs a VM it has not measured by
        allotted = tuple(Job(id=j, user="root", rms=RMS, memory_mb=site.memory_mib) for j in pilots)
        observed = consolidate.observed_vms(
            Observation(ClusterView(now=time.time(), jobs=allotted), pilots, {}, True), state, busy=0.5
        )
        for vm, now in state.samples.items():
            prev = before.get(vm)
            if prev is not None and now.t > prev.t:
                dt = now.t - prev.t
                used.append(max(0, now.cpu_time_ns - prev.cpu_time_ns) / 1e9 / dt)
                wanted.append(used[-1] + max(0, (now.vcpu_delay_ns or 0) - (prev.vcpu_delay_ns or 0)) / 1e9 / dt)
        if not measured:  # FCFS as a static scheduler books it: the requested size, start to end
            observed = [dataclasses.replace(o, demand=o.vcpus, mem=site.memory_mib) for o in observed]
        for job in queue:
            if job not in pilots:
                observed += [
                    ObservedVM(vm, job, VJobState.WAITING, None, site.memory_mib, 1, 1)
                    for vm in member_names(vm_name(RMS, job), args.vms)
                ]
        present = {o.vjob for o in observed}
        decision = control.decide(nodes, observed, [j for j in queue if j in present])
        steps += 1
        overloaded += bool(decision.overloaded)
        plan = control.plan_for(decision, optimizer="cpsat", time_limit_s=2.0)
        if plan is not None:
            placed.update(plan.placement)
            asked = coalesce(runs_as_one(plan, vms), state.members)
            t1 = time.monotonic()
            report = executor.execute(asked, reason="bench planner_live mpi experiment")
            for a in plan.actions:
                actions[a.kind.value] = actions.get(a.kind.value, 0) + 1
            for a in asked.actions:
                requests[a.kind.value] = requests.get(a.kind.value, 0) + 1
            switches.append(
                {
                    "t": round(t1 - t0, 1),
                    "s": round(time.monotonic() - t1, 1),
                    "state": report.state,
                    "overloaded": list(decision.overloaded),
                    "requests": [f"{a.kind.value} {a.vjob}" for a in asked.actions],
                }
            )
            print(
                f"{t1 - t0:7.1f} s  {report.state:<7} {', '.join(switches[-1]['requests'])}"
                f"{'  (overloaded: ' + ', '.join(decision.overloaded) + ')' if decision.overloaded else ''}",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(args.interval)
    rings = {}
    for job in queue:
        text = (site.work / f"pilot-{job}.out").read_text(errors="replace")
        rings[job] = {
            "stages": stages[job],
            "finished_s": finished[job],
            "pilot": site.state(job).state.value,
            **mpi.ring_outcome(text, len(stages[job])),
        }
    return {
        "completion_s": round(time.monotonic() - t0, 1),
        "rings": rings,
        "all_rings_right": all(r["ok"] for r in rings.values()),
        "switches": switches,
        "failed_switches": sum(s["state"] != "done" for s in switches),
        "actions": actions,
        "requests": requests,
        "steps": steps,
        "overloaded_steps": overloaded,
        "busy_readings": sum(u >= 0.5 for u in used),
        "readings": len(used),
        "starved_readings": sum(u < 0.5 <= w for u, w in zip(used, wanted, strict=True)),
        "max_core_share": round(max(used, default=0.0), 2),
    }


def mpi_image(site: LiveSite) -> dict[str, Any]:
    """The site image with Open MPI in the site's catalogue (from the build cache when there)."""
    cfg = vconfig.load(site.config)
    built = image_build.build(
        Catalogue(site.store, cfg.provisioning, data_dir=site.data), mpi.IMAGE, packages=mpi.PACKAGES
    )
    return {"image_mb": round(built.size_bytes / 2**20, 1), "build_s": round(built.build_s, 1), "cached": built.cached}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--memory", type=int, default=96, help="MiB per guest (default 96)")
    p.add_argument(
        "--experiment",
        action="store_true",
        help="instead of the action times: the cluster experiment, FCFS then the loop",
    )
    p.add_argument("--vjobs", type=int, default=3, help="experiment: vjobs (default 3)")
    p.add_argument("--vms", type=int, default=1, help="experiment: VMs per vjob (default 1)")
    p.add_argument("--stages", type=int, default=4, help="experiment: stages per VM (default 4)")
    p.add_argument("--iterations", type=int, default=200_000, help="experiment: steps of a compute stage")
    p.add_argument("--idle", type=int, default=30, help="experiment: seconds of an idle stage (default 30)")
    p.add_argument("--workload", choices=("random", "alternating"), default="random", help="experiment: stages")
    p.add_argument("--seed", type=int, default=0, help="experiment: the random workload's seed")
    p.add_argument("--interval", type=float, default=5.0, help="experiment: seconds between control steps")
    p.add_argument("--horizon", type=float, default=1800.0, help="experiment: give up after this many seconds")
    p.add_argument(
        "--program",
        choices=("shell", "mpi-ring"),
        default="shell",
        help="experiment: one-VM pilots (shell stages) or multi-node pilots (an MPI ring)",
    )
    p.add_argument("--work", type=int, default=1_000_000, help="mpi-ring: steps of a compute stage, per rank")
    p.add_argument("--node-memory", type=int, default=1024, help="experiment: MiB each node is declared")
    p.add_argument(
        "--action-timeout",
        type=float,
        default=600.0,
        help="mpi-ring: seconds a pilot may take to start, save or restore its VMs",
    )
    args = p.parse_args(argv)
    if args.program == "mpi-ring" and (args.vms != 2 or not args.experiment):
        p.error("--program mpi-ring: with --experiment and --vms 2 (one VM on each node)")
    load0 = os.getloadavg()[0]
    guest.build()  # the counter guest, built once and cached
    system = libvirtd.start_system(Path(tempfile.mkdtemp(prefix="vjob-libvirtd-log-", dir="/var/tmp")))
    second_dir = Path(os.environ.get("VJOB_TEST_SECOND_NODE_DIR", "/var/tmp/vjob-nodeb"))
    second = libvirtd.start_second_node(second_dir)
    site = LiveSite({"a": system.uri, "b": second.uri}, memory_mib=args.memory, prefix="vjob-bench-plan-live-")
    runs: list[dict[str, float]] = []
    result: dict[str, Any] = {}
    try:
        if args.experiment:
            tag = f"{os.getpid() % 100000}"
            run = experiment
            if args.program == "mpi-ring":
                result["image"] = mpi_image(site)
                run = mpi_experiment
            with Progress(2, "FCFS, then the loop") as bar:
                for name, measured in (("fcfs", False), ("loop", True)):
                    result[name] = run(site, f"{tag}{name[0]}", measured=measured, args=args)
                    print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)  # kept if the next fails
                    bar.advance()
        else:
            with Progress(args.repetitions, "live actions") as bar:
                for i in range(args.repetitions):
                    runs.append(repetition(site, f"{os.getpid() % 100000}{i:02d}"))
                    bar.advance()
    finally:
        site.close()
        if second.owned:  # only what this run started, by pid
            libvirtd.stop(second, virtlogd_pidfile=second_dir / "run" / "virtlogd.pid")
        libvirtd.stop(system)
    load = [round(load0, 2), round(os.getloadavg()[0], 2)]
    if args.experiment:
        fcfs, loop = result["fcfs"]["completion_s"], result["loop"]["completion_s"]
        print(f"completion of the set: FCFS {fcfs:.0f} s, loop {loop:.0f} s ({loop / fcfs - 1:+.1%})")
        print(
            json.dumps(
                {
                    "bench": "planner_live",
                    "experiment": {
                        **result,
                        "reduction": round(1 - loop / fcfs, 4),
                        "vjobs": args.vjobs,
                        "vms_per_vjob": args.vms,
                        "stages": args.stages,
                        "iterations": args.iterations,
                        "idle_s": args.idle,
                        "interval_s": args.interval,
                        "workload": args.workload,
                        "seed": args.seed,
                        "program": args.program,
                        "work": args.work,
                        "node_memory_mib": args.node_memory,
                    },
                    "memory_mib": args.memory,
                    "load_avg_1min": load,
                }
            )
        )
        return 0
    figures: dict[str, Any] = {}
    print(f"{'action':<15}{'mean s':>9}{'min s':>9}{'max s':>9}")
    for kind in KINDS:
        values = [r[kind] for r in runs]
        figures[kind] = {
            "mean_s": round(statistics.mean(values), 3),
            "min_s": round(min(values), 3),
            "max_s": round(max(values), 3),
        }
        print(f"{kind:<15}{figures[kind]['mean_s']:>9.2f}{figures[kind]['min_s']:>9.2f}{figures[kind]['max_s']:>9.2f}")
    print(
        json.dumps(
            {
                "bench": "planner_live",
                "repetitions": args.repetitions,
                "memory_mib": args.memory,
                "load_avg_1min": load,
                "actions": figures,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
