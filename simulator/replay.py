"""What one replay of the vjob engine (`simulator.engine.simulate`) takes and gives: the
cluster model it replays on, and the Result metrics.py turns into summary.json, CSVs and plots.

Why apart from the engine: the sweep, the tuner, the metrics and the benches read these two
records without needing the event loop that fills them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.workload import Workload
from vjob.errors import InputError


@dataclass(frozen=True)
class ClusterModel:
    """The simulated machine and the costs of moving work around on it."""

    nodes: int
    os_count: int = 2
    os_swap_s: float = 300.0
    """Provisioning time for a node to switch OS image (boot the other image's VM)."""
    bandwidth_mb_s: float = 500.0
    """Disk bandwidth per node for writing or reading a checkpoint (MB/s)."""
    memory_mb_per_node: int = 4096
    """Memory of a job's VM on each node when the trace does not say."""
    backfill_depth: int | None = 500
    """Queued jobs examined for backfilling per pass (like Slurm's bf_max_job_test)."""
    priority_refresh_s: float = 0.0
    """ubis only: seconds of simulated time a job's priority is reused before it is
    computed again (like Slurm's PriorityCalcPeriod). 0 = every pass, the exact replay; > 0
    is an approximation that trades fidelity for speed (docs/simulator.md, Speed)."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise InputError(f"--nodes = {self.nodes}: must be >= 1")
        if self.os_count < 1:
            raise InputError(f"--os-count = {self.os_count}: must be >= 1")
        if self.os_swap_s < 0 or self.bandwidth_mb_s <= 0 or self.memory_mb_per_node < 0:
            raise InputError("cluster model: os_swap_s >= 0, bandwidth_mb_s > 0 and memory_mb_per_node >= 0 needed")
        if self.backfill_depth is not None and self.backfill_depth < 0:
            raise InputError(f"--backfill-depth = {self.backfill_depth}: must be >= 0")
        if not (self.priority_refresh_s >= 0 and math.isfinite(self.priority_refresh_s)):
            raise InputError(f"--priority-refresh = {self.priority_refresh_s}: must be a finite number >= 0")


@dataclass
class Result:
    """Everything a run produced; metrics.py turns it into summary.json, CSVs and plots."""

    policy: str
    model: ClusterModel
    workload: Workload
    first_start: np.ndarray
    end: np.ndarray
    preempt_count: np.ndarray
    overhead_s: np.ndarray
    """Per job: checkpoint + restart + OS-swap seconds spent holding nodes without computing."""
    ran_privileged: np.ndarray
    """Per job: ran as an interactive job within the cap (counted against it)."""
    fit_wait: np.ndarray
    """Per interactive job: the seconds it was queued while it fitted under the cap (the cap
    had room for it), up to its first start, the victims' checkpoints included: an admitted
    job's wait (metrics, `admitted`). Time it waited for room under the cap is left out,
    also after it fitted once and then lost the room to another interactive job."""
    segments: list[tuple[int, float, float, int]]
    """(job index, start, end, nodes) of every run segment, in the order they closed."""
    preemptions: int = 0
    checkpoint_bytes: float = 0.0
    os_swaps: int = 0
    remote_resumes: int = 0
    events: int = 0
    passes: int = 0
    max_interactive_held: int = 0
