"""The agent's tick at a site's size: 10,000 nodes, 100,000 pending and 20,000 running Slurm jobs.

The cluster is built from the real recordings (Slurm 22.05's `squeue --json`, 3.7 KB a job as
Slurm prints it, or 23.11's data_parser v0.0.40 one, 6.7 KB; the node of a 21.08 `sinfo
--json`), 5 % of the jobs interactive, a pilot directory (state RUNNING on its node) for every
running batch job. Stand-in squeue/sinfo/sprio/scontrol (devkit.slurm_standin) print it to the
real adapter through real processes, and log each call. Between two ticks the cluster moves on
(`--churn` jobs end, as many start, as many arrive).

A tick here is the agent's own (agent.loop.Agent): observe (adapter, pilots, store), clean-up
bookkeeping, usage charged, the decision (preemption.scheduling.tick.decide) and the arbiter,
the priorities sent. It leaves out the checkpoints and releases the plan asks for: those wait
for pilots (none run here) and happen on events, not at every tick.

Measured, in one run: the first tick (every job read and recorded in the store), the steady
ticks (incremental observation; with `--recalc-every K` every K-th one follows a priority
recalculation, every pending job's sprio line and %Q moved, and is reported on its own as
`recalc_tick_*`, out of the steady medians), a full resync, and beside them the peers: the
stand-in's own `squeue --json` printing every job, `json.loads` of that listing, and the adapter's former path
(every job's JSON at every tick), each in its own process for its peak memory. The JSON reads
are paced on REAL squeue's measured cost carried, not the stand-in's (bench/agent_tick_pace.py
says how): `host_cpu_per_tick_s` adds it. Run it `nice -n 19`. Last line: one JSON object.
Usage: PYTHONPATH=. nice -n 19 .venv/bin/python bench/agent_tick.py [--slurm 22.05|23.11] [--nodes 10000 ...]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent_tick_pace import Carry, add_options
from agent_tick_pace import summary as pace_summary

from agent import act
from agent.arbiter import Proposals, arbitrate
from agent.loop import Agent
from agent.site_read import resync
from devkit.slurm_standin import SlurmStandIn, listing_line
from plugins import make_adapter
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from vjob.config import parse
from vjob.pilot_files import PilotDir, PilotState, PilotStatus

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "data" / "fixtures" / "slurm"
RECORDINGS = {
    "22.05": ("debian-22.05-squeue.json", "22.05.8"),
    "23.11": ("zocalo_slurmrestd_23.11_v0.0.40_jobs.json", "23.11.1"),
}
T0 = 1_795_300_000


class Synth:
    """Job objects in the recording's own layout, from its records, one per (id, state)."""

    def __init__(self, slurm: str, nodes: int) -> None:
        doc = json.loads((FIXTURES / RECORDINGS[slurm][0]).read_text())
        self.meta = doc["meta"]
        self.wrapped = isinstance(doc["jobs"][0]["job_state"], list)
        self.template = max(doc["jobs"], key=lambda j: len(json.dumps(j)))  # the fullest record
        self.nodes = [f"n{i:05d}" for i in range(1, nodes + 1)]

    def _num(self, value: int) -> Any:
        return {"set": True, "infinite": False, "number": value} if self.wrapped else value

    def item(self, job_id: int, state: str, node: str = "", *, interactive: bool = False) -> dict[str, Any]:
        rnd = random.Random(job_id)
        item = dict(self.template)
        submit = T0 + job_id
        item.update(
            job_id=self._num(job_id) if self.wrapped and isinstance(item["job_id"], dict) else job_id,
            job_state=[state] if self.wrapped else state,
            user_name=f"user{rnd.randrange(400):03d}",
            user_id=10_000 + rnd.randrange(400),
            account=f"acct{rnd.randrange(20):02d}",
            name=f"job-{job_id}",
            batch_flag=not interactive,
            priority=self._num(1000 + rnd.randrange(1000)),
            cpus=self._num(1 + rnd.randrange(4)),
            node_count=self._num(1),
            memory_per_node=self._num(1024 * (1 + rnd.randrange(4))),
            time_limit=self._num(60 * (1 + rnd.randrange(24))),
            submit_time=self._num(submit),
            start_time=self._num(submit + 600 if state == "RUNNING" else 0),
            nodes=node,
            comment="",
            admin_comment="",
        )
        return item

    def text(self, item: dict[str, Any]) -> str:
        return "    " + json.dumps(item, indent=2).replace("\n", "\n    ")


class Cluster:
    """The stand-in cluster and its motion: who runs where, who waits."""

    def __init__(self, work: Path, slurm: str, args: argparse.Namespace, *, attach: bool = False) -> None:
        """A new cluster, or (`attach`) the one built before in `work`, as it was built."""
        self.synth = Synth(slurm, args.nodes)
        bin_dir = work / "bin"
        self.standin = (
            SlurmStandIn(bin_dir)
            if attach
            else SlurmStandIn(bin_dir, version=RECORDINGS[slurm][1], meta=self.synth.meta)
        )
        self.pilots = work / "pilots"
        self.running = {i: self.synth.nodes[(i - 1) // 2 % args.nodes] for i in range(1, args.running + 1)}
        first = args.running + 1  # of the pending jobs, every 20th of the first ones waits interactive
        self.waiting = set(range(first, first + 20 * args.pending_interactive, 20))
        self.pending = list(range(args.running + 1, args.running + args.pending + 1))
        self.next_id = self.first_new = args.running + args.pending + 1
        self.delta: dict[str, str | None] = {}
        self.lines: dict[int, str] = {}
        self.rnd = random.Random(37)
        self.recalc = 0
        """How many priority recalculations so far (`--recalc-every`): each moves every pending
        job's age factor, so its sprio line and its listing priority (%Q) by 1."""
        if attach:
            text = (bin_dir / "listing.txt").read_text()
            self.lines = {int(line.partition("|")[0]): line for line in text.splitlines() if line}

    def build(self) -> None:
        """Write every job once (the base, as it is made), the nodes, the config; pilots for
        running vjobs."""

        def every_job() -> Iterator[tuple[str, str]]:
            for job_id, node in self.running.items():
                self._pilot(job_id, node, PilotState.RUNNING)
                yield str(job_id), self._put(job_id, "RUNNING", node)
            for job_id in self.pending:
                yield str(job_id), self._put(job_id, "PENDING")

        self.standin.write_base(every_job())
        self.delta = {}
        node = json.loads((FIXTURES / "rivos_sinfo_out.json").read_text())["nodes"][0]
        nodes = [dict(node, name=n, hostname=n, address=n, state="mixed") for n in self.synth.nodes]
        self.standin.write("sinfo.json", json.dumps({"meta": self.synth.meta, "errors": [], "nodes": nodes}, indent=2))
        self.standin.write("config.txt", "PriorityWeightAge = 1000\nPriorityWeightFairShare = 10000\n")
        self.publish()

    def interactive(self, job_id: int) -> bool:
        """5 % of the running and arriving jobs; of the pending ones built, `--pending-interactive`."""
        if job_id in self.running or job_id >= self.first_new:
            return job_id % 20 == 0
        return job_id in self.waiting

    def _put(self, job_id: int, state: str, node: str = "") -> str:
        item = self.synth.item(job_id, state, node, interactive=self.interactive(job_id))
        self.lines[job_id] = listing_line(item)
        return self.synth.text(item)

    def _pilot(self, job_id: int, node: str, state: PilotState) -> None:
        pdir = PilotDir(self.pilots, "slurm", str(job_id))
        if self.interactive(job_id) and state is PilotState.RUNNING:
            return  # interactive: no VM
        pdir.path.mkdir(parents=True, exist_ok=True)
        pdir.write_state(
            PilotStatus(job_id=str(job_id), vm=pdir.vm, node=node, uri="qemu:///system", state=state, since=T0)
        )

    def move(self, churn: int) -> None:
        """`churn` running jobs end, as many pending ones start on their nodes, as many arrive."""
        for job_id in self.rnd.sample(sorted(self.running), churn):
            node = self.running.pop(job_id)
            self.delta[str(job_id)] = None
            del self.lines[job_id]
            self._pilot(job_id, node, PilotState.FINISHED)
            start = self.pending.pop(self.rnd.randrange(len(self.pending)))
            self.waiting.discard(start)
            self.running[start] = node
            self.delta[str(start)] = self._put(start, "RUNNING", node)
            self._pilot(start, node, PilotState.RUNNING)
            self.pending.append(self.next_id)
            self.delta[str(self.next_id)] = self._put(self.next_id, "PENDING")
            self.next_id += 1
        self.publish()

    def recalculate(self) -> None:
        """A PriorityCalcPeriod passes: every pending job's priority moves (its age factor), in
        sprio and in the listing's %Q; the next `publish` prints it."""
        self.recalc += 1
        for job_id in self.pending:
            head, _, priority = self.lines[job_id].rpartition("|")
            self.lines[job_id] = f"{head}|{int(priority) + 1}"

    def publish(self) -> None:
        self.standin.write_delta(self.delta)
        self.standin.write("listing.txt", "\n".join(self.lines.values()) + "\n")
        age = self.recalc
        rows = (f"{j}|{1000 + j % 1000 + age}|0|0|0|0|0|{j % 1000 + age}|1000" for j in self.pending)
        self.standin.write("sprio.txt", "\n".join(rows) + "\n")


def tick(agent: Agent) -> dict[str, Any]:
    """The agent's tick up to the priorities sent (agent.loop.Agent._act_tick without the
    plan's checkpoints and releases, which wait for pilots), with the CPU of each part."""
    t0 = _cpu()
    agent.heap.tick_starts()  # as Agent.run does before each tick (agent.heap_pace)
    obs = agent.observe()
    act.clean_up(agent.ports, obs, agent.forgotten)
    act.charge_usage(agent.ports, obs.view)
    act.record_resumes(agent.ports, obs)
    t1 = _cpu()
    decision = agent._decide(obs, agent.anchors)
    agent.anchors = dict(decision.anchors)
    plan = arbitrate(Proposals(decision, obs.store_ok, deadline=False, control=False, remap=False))
    t2 = _cpu()
    exact = plan.priorities if decision.exact_priorities else None
    resync(agent.adapter, agent.sent_priorities, agent.log, exact)
    act.apply_priorities(agent.ports, plan.priorities, agent.sent_priorities)
    t3 = _cpu()
    return {
        "jobs": len(obs.view.jobs),
        "pilots": len(obs.pilots),
        "priorities": len(plan.priorities),
        "observe_cpu_s": round(t1 - t0, 3),
        "decide_cpu_s": round(t2 - t1, 3),
        "send_cpu_s": round(t3 - t2, 3),
    }


def _cpu() -> float:
    """CPU seconds of this process (user + system)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _children_cpu() -> float:
    """CPU seconds of the ended stand-in commands (what Slurm's clients would spend)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _calls(standin: SlurmStandIn) -> dict[str, int]:
    """RMS calls since the last look, by command, and the scontrol updates they carried."""
    out: dict[str, int] = {}
    for call in standin.calls():
        key = " ".join(call[:2]) if call[0] == "scontrol" and len(call) > 1 and "\n" not in call[1] else call[0]
        key = "squeue --json" if call[0] == "squeue" and any(a.startswith("--json") for a in call) else key
        out[key] = out.get(key, 0) + 1
        if call[0] == "scontrol" and len(call) == 2 and "\n" in call[1]:
            out["scontrol updates (stdin)"] = out.get("scontrol updates (stdin)", 0) + call[1].count("update ")
    standin.forget_calls()
    return out


def timed_tick(agent: Agent, standin: SlurmStandIn) -> dict[str, Any]:
    cpu, kids, wall = _cpu(), _children_cpu(), time.monotonic()
    report = tick(agent)
    look = agent.adapter.incremental.last if agent.adapter.incremental else None
    return {
        **report,
        "cpu_s": round(_cpu() - cpu, 3),
        "standin_cpu_s": round(_children_cpu() - kids, 3),
        "wall_s": round(time.monotonic() - wall, 3),
        "full_read": bool(look and look.full),
        "jobs_reused": agent.adapter.reuse.hits if look and look.full else None,  # same Job objects
        "read_json": look.fetched if look else report["jobs"],
        "applied_from_listing": look.applied if look else 0,  # state changes without their JSON
        "applied_drift": look.drift if look and look.full else None,  # of those, unlike their JSON
        "fetch_read_mb": round(agent.adapter.tail_fetch.last_read / 1e6, 3),  # of the few jobs' squeue --json
        "calls": _calls(standin),
    }


def agent_run(work: Path, slurm: str, args: argparse.Namespace) -> dict[str, Any]:
    """In its own process (its peak memory is the agent's): build, first tick, steady ticks,
    one forced resync."""
    cluster = Cluster(work, slurm, args, attach=True)
    (work / "etc").mkdir(exist_ok=True)
    cfg = parse(
        {
            "data_dir": str(work / "data"),
            # the stand-in prints up to 1 GB at nice 19 on a shared machine: not the product's 30 s
            "agent": {"pilot_dir": str(cluster.pilots), "command_timeout_s": 600},
            "slurm": {
                "bin_dir": str(cluster.standin.dir),
                "conf": str(work / "etc" / "slurm.conf"),
                "resync_every": args.resync_every,
                **{k: getattr(args, k) for k in ("json_read_share", "json_read_share_woken")},
            },
        }
    )
    agent = Agent(cfg, make_adapter("slurm", cfg), rms="slurm")
    if args.stream_fetch:
        agent.adapter.tail_fetch.limit = -1  # every size past it: the pipe stream (json_tail.Fetch)
    agent.ports.lease.hold()
    cluster.standin.forget_calls()
    carry = Carry(args.interval, args.squeue_json_wall_per_job, filtered=args.slurm != "22.05")
    carry.wrap(agent.adapter.incremental, lambda: len(cluster.lines))  # the pace on real squeue's cost
    carry.start_tick(woken=False)
    first = timed_tick(agent, cluster.standin)
    steady = []
    profile = cProfile.Profile(time.process_time) if args.profile else None  # CPU, as the figures
    for n in range(1, args.ticks + 1):
        recalc = args.recalc_every > 0 and n % args.recalc_every == 0
        if recalc:
            cluster.recalculate()
        came = cluster.next_id
        cluster.move(args.churn)
        carry.arrive([j for j in range(came, cluster.next_id) if cluster.interactive(j)], agent.adapter, args.wake)
        if profile is not None:
            profile.enable()
        steady.append(
            {**timed_tick(agent, cluster.standin), "recalc": recalc, **carry.paced(agent.adapter.incremental.last)}
        )
        if profile is not None:
            profile.disable()
        carry.seen(agent.adapter.incremental.jobs_by_id.keys())
    if profile is not None:
        profile.dump_stats(args.profile)
    cluster.move(args.churn)
    agent.adapter.incremental.since_full = args.resync_every  # the next read is the full one
    agent.heap.ticks = agent.heap.thaw_every - 1  # and the heap's thaw: the worst tick, measured
    carry.start_tick(woken=False)
    full = timed_tick(agent, cluster.standin)
    listing = sum(len(line) + 1 for line in cluster.lines.values())
    base = (cluster.standin.dir / "jobs.base").stat().st_size
    return {
        "first": first,
        "steady": steady,
        "resync": full,
        "peak_rss_mib": round(_peak_mib()),
        "json_bytes": base,
        "listing_bytes": listing,
        "carry": {"latency": carry.latency, "unseen": len(carry.arrived)},
    }


def peer_loads(work: Path) -> dict[str, Any]:
    """`json.loads` of the whole listing, as the stand-in printed it to a file."""
    text = (work / "full.json").read_text()
    cpu = _cpu()
    doc = json.loads(text)
    return {"cpu_s": round(_cpu() - cpu, 3), "jobs": len(doc["jobs"]), "peak_rss_mib": round(_peak_mib())}


def peer_former(work: Path) -> dict[str, Any]:
    """The adapter's former observation: every job's JSON at every tick (`resync_every` = 0)."""
    adapter = SlurmAdapter(SlurmCommands(bin_dir=str(work / "bin"), timeout_s=600), resync_every=0)
    adapter.version()
    cpu, kids = _cpu(), _children_cpu()
    jobs = adapter.jobs()
    return {
        "cpu_s": round(_cpu() - cpu, 3),
        "standin_cpu_s": round(_children_cpu() - kids, 3),
        "jobs": len(jobs),
        "peak_rss_mib": round(_peak_mib()),
    }


def peer_print(work: Path) -> dict[str, Any]:
    """The stand-in's `squeue --json` printing every job (to a file the next peer reads)."""
    kids, wall = _children_cpu(), time.monotonic()
    with open(work / "full.json", "wb") as out:
        subprocess.run([str(work / "bin" / "squeue"), "--json"], stdout=out, check=True)
    return {"wall_s": round(time.monotonic() - wall, 3), "cpu_s": round(_children_cpu() - kids, 3)}


def child(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run one part in a fresh interpreter: its CPU and peak memory are its own."""
    cmd = [sys.executable, __file__, "--child", name, "--work", str(work), *sys.argv[1:]]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or ["(no message)"])[-1]
        print(f"{name}: failed: {why}", file=sys.stderr)
        return {"error": why[:300]}
    found = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{name}: {json.dumps(found)}", file=sys.stderr)  # at once: a later part may fail
    return found


def summary(slurm: str, args: argparse.Namespace, parts: dict[str, Any], load: tuple[float, float]) -> dict[str, Any]:
    run = parts["agent"]
    recalcs = [t for t in run["steady"] if t.get("recalc")]
    steady = [t for t in run["steady"] if not t.get("recalc")] or run["steady"]  # medians without recalculations
    worst = max(recalcs, key=lambda t: t["cpu_s"]) if recalcs else {}
    med = sorted(t["cpu_s"] for t in steady)[len(steady) // 2]
    calls = [sum(v for k, v in t["calls"].items() if "updates" not in k) for t in run["steady"]]
    return {
        "bench": "agent_tick",
        "slurm": slurm,
        "nodes": args.nodes,
        "pending": args.pending,
        "running": args.running,
        "churn": args.churn,
        "pending_interactive": args.pending_interactive,
        "json_mb": round(run["json_bytes"] / 1e6),
        "listing_mb": round(run["listing_bytes"] / 1e6, 1),
        "first_tick_cpu_s": run["first"]["cpu_s"],
        "steady_cpu_s": med,
        "steady_observe_cpu_s": sorted(t["observe_cpu_s"] for t in steady)[len(steady) // 2],
        "steady_decide_cpu_s": sorted(t["decide_cpu_s"] for t in steady)[len(steady) // 2],
        "steady_send_cpu_s": sorted(t["send_cpu_s"] for t in steady)[len(steady) // 2],
        "steady_wall_s": sorted(t["wall_s"] for t in steady)[len(steady) // 2],
        "steady_standin_cpu_s": sorted(t["standin_cpu_s"] for t in steady)[len(steady) // 2],
        "recalc_every": args.recalc_every,
        "recalc_tick_cpu_s": worst.get("cpu_s"),
        "recalc_tick_observe_cpu_s": worst.get("observe_cpu_s"),
        "recalc_tick_decide_cpu_s": worst.get("decide_cpu_s"),
        "resync_cpu_s": run["resync"]["cpu_s"],
        "resync_observe_cpu_s": run["resync"]["observe_cpu_s"],
        "resync_wall_s": run["resync"]["wall_s"],
        "peak_rss_mib": run["peak_rss_mib"],
        "rms_calls_per_tick": max(calls),
        "calls_last_tick": steady[-1]["calls"],
        "priorities_sent_last_tick": steady[-1]["calls"].get("scontrol updates (stdin)", 0),
        "standin_squeue_json_wall_s": parts["print"]["wall_s"],
        "json_loads_cpu_s": parts["loads"].get("cpu_s"),
        "json_loads_peak_rss_mib": parts["loads"].get("peak_rss_mib"),
        "former_cpu_s": parts.get("former", {}).get("cpu_s"),
        "former_peak_rss_mib": parts.get("former", {}).get("peak_rss_mib"),
        "steady_over_squeue_json": round(med / parts["print"]["wall_s"], 3),
        "steady_over_former": round(med / parts["former"]["cpu_s"], 3) if "cpu_s" in parts.get("former", {}) else None,
        **pace_summary(run["steady"], run["carry"], args),
        "load_avg": [round(load[0], 2), round(load[1], 2)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slurm", choices=sorted(RECORDINGS), default="22.05")
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--running", type=int, default=20_000)
    parser.add_argument(
        "--pending-interactive",
        type=int,
        default=250,
        help="interactive jobs among the pending ones built (5 %% of 100,000 would be 5,000: see docs)",
    )
    parser.add_argument("--churn", type=int, default=20, help="jobs ending, starting and arriving per tick (each)")
    parser.add_argument("--ticks", type=int, default=5, help="steady ticks measured")
    parser.add_argument("--resync-every", type=int, default=30)
    add_options(parser)
    parser.add_argument(
        "--recalc-every",
        type=int,
        default=0,
        help="every K-th steady tick, every pending job's priority moves in sprio and the listing, as"
        " Slurm's PriorityCalcPeriod does; that tick's CPU is recalc_tick_cpu_s, out of the steady"
        " medians (0: never)",
    )
    parser.add_argument("--no-former", action="store_true", help="skip the former path's peer (GiBs of memory)")
    parser.add_argument(
        "--stream-fetch", action="store_true", help="22.05: the few jobs' JSON streamed through a pipe, not a memfd"
    )
    parser.add_argument("--profile", default="", help="write the steady ticks' cProfile stats here")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--work", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        work = Path(args.work)
        part = {
            "agent": lambda: agent_run(work, args.slurm, args),
            "loads": lambda: peer_loads(work),
            "former": lambda: peer_former(work),
            "print": lambda: peer_print(work),
        }[args.child]
        print(json.dumps(part()))
        return
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="vjob-agent-tick-"))
    try:
        t = time.monotonic()
        Cluster(work, args.slurm, args).build()  # here: the agent's process starts without it
        print(f"cluster built in {time.monotonic() - t:.0f} s", file=sys.stderr)
        parts: dict[str, Any] = {"agent": child("agent", work, args)}
        if "error" in parts["agent"]:
            sys.exit(f"agent_tick: the agent's run failed: {parts['agent']['error']}")
        parts["print"] = peer_print(work)
        parts["loads"] = child("loads", work, args)
        if not args.no_former:
            parts["former"] = child("former", work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for n, t in enumerate(parts["agent"]["steady"], 1):
        print(f"steady tick {n}: {json.dumps(t)}", file=sys.stderr)
    print(json.dumps(summary(args.slurm, args, parts, (load_start, os.getloadavg()[0]))))


if __name__ == "__main__":
    main()
