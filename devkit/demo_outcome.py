"""What one demo run showed, and the claims it is held to (issue 32).

Why apart from the scenario: the claims the README makes (victims, resumes, no work lost,
results identical, an interactive start within a share of the no-preemption wait) are decided
here from measured figures only, so the CI test (tests/test_realjob_demo.py) checks the
decisions without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devkit.demo_jobs import REAL_PACE_S, TINY_IMAGE, progress_steps, steps_around_resume
from devkit.guest_probe import boots, split_counters
from vjob.pilot_files import PilotState, PilotStatus

START_RATIO_MAX = 0.25
"""The interactive job must start within this share of the wait it would have had without
preemption (issue 32), both measured in the same run."""


def remaining_run_s(history: list[dict[str, Any]], t0: float) -> float | None:
    """A job's run time left at `t0` had nothing preempted it: from `t0` to its pilot's end,
    less the time it spent checkpointed after `t0` (from each save's start to its VM running
    again). None when the pilot has not ended."""
    end: float | None = None
    down, cut = 0.0, None
    for h in history:
        if h["at"] < t0:
            continue
        if h["state"] in (PilotState.SAVING.value, PilotState.SAVED.value) and cut is None:
            cut = h["at"]
        elif h["state"] == PilotState.RUNNING.value and cut is not None:
            down, cut = down + h["at"] - cut, None
        elif h["state"] == PilotState.FINISHED.value:
            end = h["at"]
    return None if end is None else end - t0 - down


def no_preemption_wait(remaining: list[float | None], jobs_needed: int) -> float | None:
    """How long an interactive job needing the nodes of `jobs_needed` batch jobs waits on a full
    cluster without preemption: until that many batch jobs have ended, i.e. the
    `jobs_needed`-th shortest remaining run time. None when a job's end is unknown.

    Why this and not a second run without the agent: a Slurm-alone phase would boot all the
    guests again (minutes under TCG, and another draw of the machine's load), while the batch
    jobs of this very run say how long they still had to go. It is a lower bound of Slurm
    alone's wait: Slurm's scheduling pass after the ends is not counted, and the jobs vjob did
    not preempt ran with the victims' share of the CPU free, so they ended earlier than they
    would have beside them."""
    if jobs_needed < 1 or any(r is None for r in remaining) or len(remaining) < jobs_needed:
        return None
    return sorted(r for r in remaining if r is not None)[jobs_needed - 1]


def victim_work(st: PilotStatus, output: Path | None) -> tuple[float, tuple[int, int] | None]:
    """A victim's work lost, and where it stood around its checkpoint: (last before, first after).

    A real job (`output`: its output file) lost the time of the progress steps it printed twice
    (a lower bound); its pair is the progress steps around its first "restoring VM" line. The
    counter guest lost the counters it printed twice, and all it had counted if it booted again.
    """
    if output is not None:
        steps = progress_steps(output)
        return REAL_PACE_S * (len(steps) - len(set(steps))), steps_around_resume(output)
    lost = 0.0
    pair = None
    before, after = split_counters(Path(st.console_log), st.console_bytes_at_save)
    if before and after:
        pair = (before[-1], after[0])
        # Counters the guest prints twice were computed twice: work lost.
        lost += max(0, before[-1] + 1 - after[0])
    if boots(Path(st.console_log)) > 1:
        lost += float(before[-1]) if before else 0.0
    return lost, pair


@dataclass
class Timeline:
    """Events of one run, seconds since the interactive job was submitted."""

    t0: float = 0.0
    events: list[tuple[float, str]] = field(default_factory=list)

    def add(self, at: float, text: str) -> None:
        """An event at `at` (time.time()), kept relative to the interactive job's submission."""
        self.events.append((at - self.t0, text))

    def lines(self) -> list[str]:
        """The events in time order, one printable line each."""
        return [f"{t:+8.2f} s  {text}" for t, text in sorted(self.events)]


@dataclass
class Outcome:
    """The figures of one run, each measured in it; `problems` says which claims they break."""

    interactive_start_s: float
    victims: list[str]
    resumed: list[str]
    local_resumes: int
    work_lost_s: float
    counters: dict[str, tuple[int, int]]
    """Victim → (last counter before its checkpoint, first counter after its resume)."""
    preempt_counts: dict[str, int]
    checkpoint_seconds: dict[str, float]
    timeline: Timeline

    image: str = TINY_IMAGE
    outputs_identical: bool | None = None
    """Real jobs: every result.txt equals the uninterrupted run's and every output file holds
    each progress line once (None for the counter guest, which writes no result)."""
    elapsed_s: float = 0.0
    snapshots_in_store: int = 0
    """Victims whose checkpoint the agent recorded in the store's `snapshots`."""
    nodes_with_image: int = 0
    """Nodes whose OS (node_images) is the jobs' image once they ran it (0 for the counter guest)."""
    no_preemption_wait_s: float | None = None
    """How long the interactive job would have waited without preemption, measured in the same
    run (`no_preemption_wait`; None for the counter guest, whose jobs never end)."""
    victims_needed: int = 2
    """Batch jobs whose nodes the interactive job needs (its nodes / a batch job's nodes)."""

    def problems(self) -> list[str]:
        """What the run failed to show, one phrase each ([] when it showed everything the README
        claims): the demo's exit status and the CI test (tests/test_realjob_demo.py) read it."""
        found = []
        if len(self.victims) < self.victims_needed:
            found.append(f"victims {len(self.victims)}, want >= {self.victims_needed}")
        if len(self.resumed) != len(self.victims):
            found.append(f"resumed {len(self.resumed)} of {len(self.victims)} victims")
        if self.work_lost_s != 0:
            found.append(f"work lost {self.work_lost_s:.1f} s")
        if self.snapshots_in_store < len(self.victims):
            found.append(f"snapshots in the store {self.snapshots_in_store} < victims {len(self.victims)}")
        if self.image == TINY_IMAGE:
            return found
        if self.outputs_identical is not True:
            found.append("a job's result or output differs from an uninterrupted run")
        if self.nodes_with_image <= 0:
            found.append(f"no node records {self.image} as its OS")
        wait = self.no_preemption_wait_s
        if wait is None:
            found.append("the no-preemption wait was not measured (a batch job's end is unknown)")
        elif self.interactive_start_s > START_RATIO_MAX * wait:
            found.append(
                f"interactive start {self.interactive_start_s:.2f} s > {START_RATIO_MAX} x the no-preemption "
                f"wait {wait:.2f} s"
            )
        return found

    def json_line(self) -> dict[str, Any]:
        """The demo's last output line (tests/test_realjob_demo.py and the README read it)."""
        return {
            "demo": "slurm",
            "image": self.image,
            "interactive_start_s": round(self.interactive_start_s, 2),
            "victims": len(self.victims),
            "resumed": len(self.resumed),
            "work_lost_s": round(self.work_lost_s, 2),
            "outputs_identical": self.outputs_identical,
            "elapsed_s": round(self.elapsed_s, 1),
            "snapshots_in_store": self.snapshots_in_store,
            "nodes_with_image": self.nodes_with_image,
            "no_preemption_wait_s": None if self.no_preemption_wait_s is None else round(self.no_preemption_wait_s, 2),
        }
