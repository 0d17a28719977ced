"""Sizing figures for docs/operator.md: store growth per job and the agent's memory.

The agent's own loop (agent.loop.Agent.tick: lease, observe with pilot files and store,
usage, the decision, priorities) runs against an RMS played in this process (the one stand-in:
PBS and Slurm cannot be given 10,000 jobs here) that lets `--arrive` batch jobs arrive each
tick, starts the oldest on free nodes (each running vjob with its pilot directory, state
RUNNING, so the agent records its VM), and ends jobs after `--runtime` ticks (pilot FINISHED,
gone from the RMS). Every 10th job is checkpointed once through the agent's own ending of a
checkpoint (act.finish_checkpoint: Pn in the store), and resumed two ticks later.

Printed, one JSON line per store: bytes per job the store grew (SQLite: the file after a WAL
checkpoint; PostgreSQL: pg_total_relation_size of vjob's tables), at the end of `--jobs` jobs;
and the agent's resident memory (VmRSS, and the peak) with 1,000 and 10,000 jobs queued at once
(`--queue`). Run it `nice -n 19`.
Usage: .venv/bin/python bench/sizing.py [--jobs 5000] [--postgres URL] [--queue 1000,10000]
"""

from __future__ import annotations

import argparse
import json
import resource
import sqlite3
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from agent import act
from agent.loop import Agent
from agent.metrics import AgentMetrics
from vjob.config import parse
from vjob.model import Job, JobClass, JobState, Node, NodeState
from vjob.pilot_files import PilotDir, PilotState, PilotStatus
from vjob.rms import Abilities, JobEnvironment, PriorityKnob
from vjob.store.db import Store

TABLES = ("jobs", "vms", "usage", "targets", "switches", "actions", "leases", "snapshots", "vm_ids")


class PlayedRMS:
    """An RMS with `nodes` one-core nodes; jobs arrive, start, end as `step` says."""

    name = "slurm"
    abilities = Abilities(
        priority=PriorityKnob(0, 1_000_000, min_step=1000),
        requeue_hold=True,
        hold_release=True,
        suspend=False,
        pin_nodes=False,
        start_now=False,
        environment=JobEnvironment("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_JOB_NODELIST"),
    )

    def __init__(self, nodes: int, pilots: Path) -> None:
        self.node_names = [f"n{i:05d}" for i in range(nodes)]
        self.jobs_by_id: dict[str, Job] = {}
        self.started: dict[str, int] = {}
        self.pilots = pilots
        self.next_id = 1
        self.tick_no = 0

    def jobs(self) -> list[Job]:
        return list(self.jobs_by_id.values())

    def nodes(self) -> list[Node]:
        busy = {n for j in self.jobs_by_id.values() for n in j.allocated_nodes}
        state = {n: NodeState.ALLOCATED if n in busy else NodeState.IDLE for n in self.node_names}
        return [Node(n, 1, 4096, state=state[n]) for n in self.node_names]

    def set_priority(self, job_id: str, value: int) -> None:
        return None

    def requeue_hold(self, job_id: str) -> None:
        job = self.jobs_by_id[job_id]
        self.jobs_by_id[job_id] = replace(job, state=JobState.HELD, allocated_nodes=())

    def release(self, job_id: str) -> None:
        job = self.jobs_by_id[job_id]
        self.jobs_by_id[job_id] = replace(job, state=JobState.PENDING)

    def hold(self, job_id: str) -> None:
        return None

    def tell_wait(self, job_id: str, reason: str | None) -> bool:
        return False

    def arrive(self, count: int, now: float) -> None:
        for _ in range(count):
            job_id = str(self.next_id)
            self.next_id += 1
            self.jobs_by_id[job_id] = Job(
                id=job_id,
                user=f"user{int(job_id) % 97:02d}",
                job_class=JobClass.BATCH,
                rms="slurm",
                nodes=1,
                cores=1,
                memory_mb=1024,
                walltime=3600.0,
                submit_time=now,
                state=JobState.PENDING,
                os_image="debian12",
            )

    def step(self, runtime: int, now: float) -> None:
        """End the jobs that ran `runtime` ticks, start pending ones on free nodes."""
        self.tick_no += 1
        for job_id, at in list(self.started.items()):
            if self.tick_no - at >= runtime and self.jobs_by_id[job_id].state is JobState.RUNNING:
                del self.jobs_by_id[job_id], self.started[job_id]
                self._pilot(job_id, "", PilotState.FINISHED)
        busy = {n for j in self.jobs_by_id.values() for n in j.allocated_nodes}
        free = [n for n in self.node_names if n not in busy]
        for job in sorted(self.jobs_by_id.values(), key=lambda j: int(j.id)):
            if not free:
                break
            if job.state is JobState.PENDING:
                node = free.pop()
                self.jobs_by_id[job.id] = replace(job, state=JobState.RUNNING, allocated_nodes=(node,), start_time=now)
                self.started.setdefault(job.id, self.tick_no)
                self._pilot(job.id, node, PilotState.RUNNING)

    def _pilot(self, job_id: str, node: str, state: PilotState) -> None:
        pdir = PilotDir(self.pilots, "slurm", job_id)
        pdir.ensure()
        old = pdir.read_state()
        node = node or (old.node if old else "n00000")
        pdir.write_state(
            PilotStatus(
                job_id=job_id,
                vm=pdir.vm,
                node=node,
                uri="qemu:///system",
                state=state,
                since=time.time(),
                saved_node=node,
                saved_nodes=[node],
            )
        )


def store_bytes(url: str) -> int:
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return Path(path).stat().st_size
    engine = create_engine(url)
    with engine.connect() as conn:
        total = sum(conn.execute(text(f"SELECT pg_total_relation_size('{t}')")).scalar_one() for t in TABLES)
    engine.dispose()
    return int(total)


def grow(url: str, work: Path, jobs: int, nodes: int, arrive: int, runtime: int) -> dict[str, Any]:
    """Run the agent until `jobs` jobs arrived and most have ended; the store's bytes per job."""
    cfg = parse(
        {
            "data_dir": str(work / "data"),
            "database": {"url": url},
            "agent": {"pilot_dir": str(work / "pilots"), "cleanup_after_s": 1e9},
            "planner": {"optimizer": "ffd"},
        }
    )
    Store(url).upgrade()
    empty = store_bytes(url)
    rms = PlayedRMS(nodes, work / "pilots")
    agent = Agent(cfg, rms, rms="slurm", metrics=AgentMetrics(), owner="sizing")  # type: ignore[arg-type]
    checkpointed: dict[str, int] = {}
    t0 = time.monotonic()
    while rms.next_id <= jobs or rms.started:
        now = time.time()
        if rms.next_id <= jobs:
            rms.arrive(min(arrive, jobs - rms.next_id + 1), now)
        rms.step(runtime, now)
        report = agent.tick()
        assert not report.errors, report.errors
        for job_id, st in list(rms.started.items()):  # every 10th job: checkpointed once, resumed
            if int(job_id) % 10 == 0 and job_id not in checkpointed and rms.tick_no - st == 1:
                rms._pilot(job_id, "", PilotState.SAVED)
                act.finish_checkpoint(agent.ports, job_id)
                checkpointed[job_id] = rms.tick_no
        for job_id, at in list(checkpointed.items()):
            if at and rms.tick_no - at == 2 and job_id in rms.jobs_by_id:
                rms.release(job_id)
                checkpointed[job_id] = 0
    agent.ports.lease.give_up()
    size = store_bytes(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in ("jobs", "vms", "usage")}
    engine.dispose()
    return {
        "rows": rows,
        "store": url.split(":")[0],
        "jobs": jobs,
        "checkpointed": len(checkpointed),
        "ticks": rms.tick_no,
        "empty_bytes": empty,
        "bytes": size,
        "bytes_per_job": round((size - empty) / jobs),
        "seconds": round(time.monotonic() - t0, 1),
    }


def rss_mib() -> tuple[float, float]:
    """(VmRSS, peak) of this process in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            current = int(line.split()[1]) / 1024
    return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory(work: Path, queued: int) -> dict[str, Any]:
    """The agent's RSS after ticks with `queued` jobs in the RMS at once (a tenth running)."""
    before = rss_mib()[0]
    url = f"sqlite:///{work / 'mem.sqlite'}"
    cfg = parse(
        {
            "data_dir": str(work / "data"),
            "database": {"url": url},
            "agent": {"pilot_dir": str(work / "pilots"), "cleanup_after_s": 1e9},
            "planner": {"optimizer": "ffd"},
        }
    )
    Store(url).upgrade()
    rms = PlayedRMS(max(1, queued // 10), work / "pilots")
    rms.arrive(queued, time.time())
    rms.step(10**9, time.time())
    agent = Agent(cfg, rms, rms="slurm", metrics=AgentMetrics(), owner="memory")  # type: ignore[arg-type]
    t0 = time.monotonic()
    for _ in range(3):
        assert not agent.tick().errors
    current, peak = rss_mib()
    agent.ports.lease.give_up()
    return {
        "queued": queued,
        "running": len(rms.started),
        "rss_mib": round(current, 1),
        "peak_rss_mib": round(peak, 1),
        "rss_before_mib": round(before, 1),
        "seconds_per_tick": round((time.monotonic() - t0) / 3, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--arrive", type=int, default=100)
    ap.add_argument("--runtime", type=int, default=3)
    ap.add_argument("--postgres", metavar="URL", default=None, help="an empty PostgreSQL database")
    ap.add_argument("--queue", default="1000,10000", help="queue sizes for the memory figures ('' for none)")
    ap.add_argument("--what", choices=("store", "memory", "both"), default="both")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vjob-sizing-") as tmp:
        base = Path(tmp)
        if args.what in ("store", "both"):
            urls = [f"sqlite:///{base / 'grow.sqlite'}"] + ([args.postgres] if args.postgres else [])
            for i, url in enumerate(urls):
                work = base / f"grow{i}"
                print(json.dumps(grow(url, work, args.jobs, args.nodes, args.arrive, args.runtime)), flush=True)
        if args.what in ("memory", "both"):
            for queued in [int(q) for q in args.queue.split(",") if q]:
                print(json.dumps(memory(base / f"mem{queued}", queued)), flush=True)


if __name__ == "__main__":
    main()
