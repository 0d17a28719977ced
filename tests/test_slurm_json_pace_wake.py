"""A wake makes the agent's next look read the new jobs' JSON at the woken pace (issue 37 item 1).

job_submit.lua rewrites `vjob-agent.wake` beside slurm.conf when it accepts an interactive job;
the agent's loop (Agent.run) ticks at once and tells the adapter (`SlurmAdapter.woken`), so the
job is not held back by the pace of `squeue --json` reads (plugins.slurm.json_pace). Run on the
Slurm stand-in printing the real 22.05 recording; the pace's clock is the test's (one second a
look at it), so the read is never due by time here: only the wake can bring it.
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path

from agent.loop import Agent
from agent.metrics import AgentMetrics
from devkit.slurm_standin import listing_line
from plugins import make_adapter
from plugins.slurm.environment import wake_file
from tests.services import wait_for
from tests.standin_recorded import recorded_standin
from vjob.config import parse

BOUND_S = 60.0
"""A hang bound for the loop's woken tick (the interval is 600 s)."""


class Ticking:
    """A clock that moves one second each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_a_wake_file_change_reads_the_held_back_job_at_the_woken_tick(tmp_path: Path) -> None:
    standin, jobs = recorded_standin(tmp_path)
    cfg = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "agent": {"pilot_dir": str(tmp_path / "pilots"), "interval_s": 600},
            "slurm": {
                "bin_dir": str(standin.dir),
                "conf": str(tmp_path / "etc" / "slurm.conf"),
                "resync_every": 30,
                "json_read_share": 0.01,
            },
        }
    )
    metrics = AgentMetrics()
    with Agent(cfg, make_adapter("slurm", cfg), rms="slurm", metrics=metrics) as agent:
        incremental = agent.adapter.incremental
        incremental.pace.clock = Ticking()  # each read "takes" 1 s: the next one due ~99 s of it later
        assert agent.run(once=True) and incremental.synced
        assert incremental.pace.reads == 1 and incremental.pace.last_wall == 1.0  # timed on the test's clock

        pending = next(v for v in jobs.values() if "PENDING" in str(v["job_state"]))
        new = dict(copy.deepcopy(pending), job_id=900_001, name="srun-like")
        standin.write_delta({"900001": json.dumps(new, indent=2)})
        jobs["900001"] = new
        standin.write("listing.txt", "".join(listing_line(v) + "\n" for v in jobs.values()))
        assert agent.run(once=True)
        assert incremental.last.deferred == 1 and "900001" not in incremental.jobs_by_id  # paced

        def ticks() -> float:
            return metrics.registry.get_sample_value("vjob_agent_ticks_total") or 0.0

        stop = threading.Event()
        loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        loop.start()
        try:
            wait_for(lambda: ticks() >= 3, BOUND_S, "the loop's first tick")
            assert "900001" not in incremental.jobs_by_id and incremental.last.deferred == 1
            wake_file(cfg.slurm.conf).write_text("")  # what job_submit.lua does for srun/salloc
            wait_for(lambda: ticks() >= 4, BOUND_S, "the tick woken by the wake file")
        finally:
            stop.set()
            loop.join(timeout=60)
        assert not loop.is_alive()
        assert "900001" in incremental.jobs_by_id and incremental.last.read and not incremental.pace.forced
