"""The consolidation loop relieving an overloaded node, live, with vjobs of several real VMs.

Why a separate bench: bench/planner_live.py's experiment never saw an overloaded node (its
vjobs of one VM fill idle CPUs, nothing later competes), so the loop's relief was only
tested on libvirt's test driver. Here the overload is made to happen, on real QEMU guests
(the counter guest under TCG, 96 MiB) running a real CPU payload (shell arithmetic):

* two nodes, each declared one CPU (the machine has two cores): by default both on the
  system libvirtd (the scenario moves no VM between them: suspends and local resumes only,
  and the second libvirtd is restarted by other tests on this shared machine),
  `--second-libvirtd` puts b on planner_live's second libvirtd; two vjobs of `--vms` VMs
  (one pilot each), FCFS queue X then Y;
* X's VMs start with an idle stage of `--idle` seconds, then compute `--x-stages` stages;
  Y's VMs compute `--y-stages` stages from the start;
* the loop (every `--interval` s: libvirt's domain statistics of each node, sampled as the
  agent does (agent.consolidate: CPU time plus the vCPUs' wait for a host CPU, memory) →
  demand, the FCFS decision, the planner, the executor through the pilots, as in
  planner_live's experiment) runs X on both nodes; X measured idle → Y starts beside it; X
  computes → both nodes are overloaded (two busy VMs on one CPU) and no node has room, so the
  plan suspends Y, the vjob the queue puts last (all its VMs in one pool); X then has the cores
  to itself; when X's VMs finish, Y is resumed and completes.

`--hogs N` runs N CPU-bound processes beside the guests (killed by pid at the end): an
oversubscribed host, where a computing guest gets a fraction of a core and is starved, not
idle. `--own-libvirtd DIR` puts both nodes on a libvirtd of this run's own (other engineers'
tests restart the system one).

Figures: when the overload was first seen and when the switch that relieved it ended, the
switch's actions and duration, the share of a core X's VMs got while overloaded and after,
each vjob's completion; the loop's steps, one line each, on stderr. Last line: JSON.

    .venv/bin/python bench/planner_relief.py [--vms 2] [--idle 45] [--x-stages 4] [--y-stages 12] [--hogs 4]
        [--own-libvirtd /var/tmp/vjob-relief]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from agent.pilot_performer import EXECUTOR_TAG, PilotRequestPerformer
from devkit import libvirtd
from preemption.executor import Executor
from preemption.planner import NodeSpec, control
from provisioning import guest
from vjob.errors import VjobError
from vjob.pilot_files import PilotState


def _planner_live() -> ModuleType:
    """bench/planner_live.py (LiveSite, Workload, the payload): scripts, not a package."""
    spec = importlib.util.spec_from_file_location("bench_planner_live", Path(__file__).with_name("planner_live.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


live = _planner_live()


def run(site: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The loop from submission to the end of both vjobs; what it saw and did."""
    args.vjobs, args.workload, args.stages, args.seed = 2, "alternating", 1, 0
    tag = f"{os.getpid() % 100000}r"
    work = live.Workload(site, tag, args)
    for vjob, job in work.jobs.values():
        pattern = "I" + "C" * args.x_stages if vjob == "v0" else "C" * args.y_stages
        work.payload[job].write_text(live.stage_payload(pattern, args.iterations, args.idle))
    nodes = tuple(NodeSpec(n, 1, 1024) for n in site.nodes)
    performer = PilotRequestPerformer(
        lambda a: site.pdir(work.job(a.vm)),
        timeout_s=120,
        start_job=lambda a: site.pilot(work.job(a.vm), a.dst or "", work.payload[work.job(a.vm)]),
    )
    executor = Executor(
        performer,
        site.store,
        pipeline_interval_s=0.1,
        tag=EXECUTOR_TAG,
        job_key=lambda a: f"{live.RMS}:{work.job(a.vm)}",
    )
    steps: list[dict[str, Any]] = []
    switches: list[dict[str, Any]] = []
    finished: dict[str, float] = {}
    # The share of a core each busy reading of X's VMs shows (used, and used + waited for a host
    # CPU), by phase: Y beside it or not.
    shares: dict[str, list[float]] = {"shared": [], "alone": []}
    wants: dict[str, list[float]] = {"shared": [], "alone": []}
    last: dict[str, tuple[float, float, float]] = {}
    y_running = False
    t0 = time.monotonic()
    while True:
        observed, done = work.observe(True)
        now = time.monotonic() - t0
        for vm, (cpu_s, delay_s, at) in work.readings.items():
            prev = last.get(vm)
            if work.jobs[vm][0] == "v0" and prev is not None and at > prev[2]:
                share = (cpu_s - prev[0]) / (at - prev[2])
                wanted = share + (delay_s - prev[1]) / (at - prev[2])
                if wanted >= 0.5:  # computing, starved or not (an idle guest reads about 0.01)
                    shares["shared" if y_running else "alone"].append(share)
                    wants["shared" if y_running else "alone"].append(wanted)
            last[vm] = (cpu_s, delay_s, at)
        y_running = any(o.vjob == "v1" and o.state.value == "running" for o in observed)
        for vjob in ("v0", "v1"):
            if vjob not in finished and vjob not in {o.vjob for o in observed} and _all_finished(site, work, vjob):
                finished[vjob] = now
        if done:
            break
        if now > args.horizon:
            raise VjobError(f"relief bench: not finished within {args.horizon} s")
        present = {o.vjob for o in observed}
        decision = control.decide(nodes, observed, [j for j in ("v0", "v1") if j in present])
        step = {
            "t": round(now, 1),
            "overloaded": list(decision.overloaded),
            "vms": {
                vm.rsplit("-", 1)[-1]: f"{o.state.value[0]}{o.host or '-'}:{o.demand}"
                for o in observed
                for vm in [o.vm]
            },
        }
        plan = control.plan_for(decision, optimizer="cpsat", time_limit_s=2.0)
        if plan is not None:
            t1 = time.monotonic()
            report = executor.execute(plan, reason="bench planner_relief")
            kinds: dict[str, int] = {}
            for a in plan.actions:
                kinds[a.kind.value] = kinds.get(a.kind.value, 0) + 1
            switches.append(
                {
                    "t": round(t1 - t0, 1),
                    "end": round(time.monotonic() - t0, 1),
                    "s": round(time.monotonic() - t1, 1),
                    "state": report.state,
                    "overloaded": list(decision.overloaded),
                    "actions": kinds,
                    "pools": len(plan.pools),
                }
            )
            step["switch"] = switches[-1]
        steps.append(step)
        print(json.dumps(step), file=sys.stderr, flush=True)
        time.sleep(args.interval)
    return _figures(steps, switches, finished, work, now) | {
        "x_core_share": {k: round(statistics.mean(v), 2) if v else None for k, v in shares.items()},
        "x_core_wanted": {k: round(statistics.mean(v), 2) if v else None for k, v in wants.items()},
        "x_busy_readings": {k: len(v) for k, v in shares.items()},
    }


def _all_finished(site: Any, work: Any, vjob: str) -> bool:
    for _vm, (vj, job) in work.jobs.items():
        if vj != vjob:
            continue
        try:
            st = site.pdir(job).read_state() if site.pdir(job).exists() else None
        except VjobError:
            return False
        if st is None or st.state is not PilotState.FINISHED:
            return False
    return True


def _figures(
    steps: list[dict[str, Any]], switches: list[dict[str, Any]], finished: dict[str, float], work: Any, end: float
) -> dict[str, Any]:
    first_over = next((s["t"] for s in steps if s["overloaded"]), None)
    relief = next((sw for sw in switches if sw["overloaded"] and sw["state"] == "done"), None)
    over_steps = sum(bool(s["overloaded"]) for s in steps)
    return {
        "completion_s": round(end, 1),
        "finished_s": {("X" if k == "v0" else "Y"): round(v, 1) for k, v in finished.items()},
        "steps": len(steps),
        "overloaded_steps": over_steps,
        "first_overload_s": first_over,
        "relief": relief,
        "relieved_after_s": round(relief["end"] - first_over, 1) if relief and first_over is not None else None,
        "switches": switches,
        "failed_switches": sum(sw["state"] != "done" for sw in switches),
        "busy_readings": sum(u >= 0.5 for u in work.used),
        "starved_readings": sum(u < 0.5 <= w for u, w in zip(work.used, work.wanted, strict=True)),
        "readings": len(work.used),
        "measured_mib": {"min": min(work.memory_seen, default=None), "max": max(work.memory_seen, default=None)},
        "mean_core_share_busy": round(statistics.mean([u for u in work.used if u >= 0.5] or [0.0]), 2),
        "mean_core_share_wanting": round(
            statistics.mean([u for u, w in zip(work.used, work.wanted, strict=True) if w >= 0.5] or [0.0]), 2
        ),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memory", type=int, default=96, help="MiB per guest (default 96)")
    p.add_argument("--vms", type=int, default=2, help="VMs per vjob (default 2)")
    p.add_argument("--idle", type=int, default=45, help="seconds of X's first, idle stage (default 45)")
    p.add_argument("--x-stages", type=int, default=4, help="X's compute stages after the idle one (default 4)")
    p.add_argument("--y-stages", type=int, default=12, help="Y's compute stages (default 12)")
    p.add_argument("--iterations", type=int, default=200_000, help="steps of a compute stage")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between control steps")
    p.add_argument("--horizon", type=float, default=1200.0, help="give up after this many seconds")
    p.add_argument(
        "--hogs",
        type=int,
        default=0,
        help="CPU-bound processes to run beside the guests: an oversubscribed host (default 0)",
    )
    p.add_argument(
        "--second-libvirtd",
        action="store_true",
        help="node b on the second libvirtd (default: both nodes on the system libvirtd)",
    )
    p.add_argument(
        "--own-libvirtd",
        type=Path,
        metavar="DIR",
        help="both nodes on a libvirtd of this run's own, its state in DIR (others' tests restart the system one)",
    )
    args = p.parse_args(argv)
    # SIGTERM ends the run through the clean-up below (pilots killed, VMs deleted).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load0 = os.getloadavg()[0]
    guest.build()
    if args.own_libvirtd:
        system = libvirtd.start_second_node(args.own_libvirtd, hostname="relief", migration_ports=(49400, 49420))
    else:
        system = libvirtd.start_system(Path(tempfile.mkdtemp(prefix="vjob-libvirtd-log-", dir="/var/tmp")))
    second_dir = Path(os.environ.get("VJOB_TEST_SECOND_NODE_DIR", "/var/tmp/vjob-nodeb"))
    second = libvirtd.start_second_node(second_dir) if args.second_libvirtd else None
    uri_b = second.uri if second is not None else system.uri
    site = live.LiveSite({"a": system.uri, "b": uri_b}, memory_mib=args.memory, prefix="vjob-bench-relief-")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        result = run(site, args)
    finally:
        for hog in hogs:  # only what this run started, by pid
            hog.kill()
            hog.wait()
        site.close()
        if second is not None and second.owned:  # only what this run started, by pid
            libvirtd.stop(second, virtlogd_pidfile=second_dir / "run" / "virtlogd.pid")
        if args.own_libvirtd and system.owned:
            libvirtd.stop(system, virtlogd_pidfile=args.own_libvirtd.resolve() / "run" / "virtlogd.pid")
        elif not args.own_libvirtd:
            libvirtd.stop(system)
    load = [round(load0, 2), round(os.getloadavg()[0], 2)]
    relief = result["relief"]["actions"] if result["relief"] else "nothing"
    print(
        f"overload first seen at {result['first_overload_s']} s, relieved after {result['relieved_after_s']} s "
        f"by {relief}; set done in {result['completion_s']} s"
    )
    print(
        json.dumps(
            {
                "bench": "planner_relief",
                **result,
                "vms_per_vjob": args.vms,
                "idle_s": args.idle,
                "x_stages": args.x_stages,
                "y_stages": args.y_stages,
                "iterations": args.iterations,
                "interval_s": args.interval,
                "memory_mib": args.memory,
                "second_libvirtd": args.second_libvirtd,
                "hogs": args.hogs,
                "load_avg_1min": load,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
