"""How one pilot behaves (pilot.pilot): what `vjob run` learnt from its arguments, the job's
environment and the configuration, fixed for the pilot's life.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PilotSettings:
    """How one pilot behaves; `node` is the RMS node name it runs on."""

    rms: str
    job_id: str
    node: str
    image: str = ""
    memory_mb: int = 128
    vcpus: int = 1
    """The VM's vCPUs (pilot.sizing: the CPUs the RMS allocated on this node)."""
    poll_s: float = 0.2
    orphan_resume_s: float = 30.0
    """After an agent-requested save, restore the VM if not requeued within this time."""
    restart_count: int | None = None
    """How often the RMS restarted the job (Slurm: SLURM_RESTART_COUNT); None when unknown.
    0 means a first start: state left under the same job id belongs to an older job."""
    workdir: Path | None = None
    """A real job's working directory (staged into its job disk, results copied back); None
    for the counter guest."""
    cpu_sample_s: float = 5.0
    """How often the VM's CPU time is written to the state file (the control loop's demand)."""
    partner_hold_s: float = 0.0
    """When the job ends with its VM moved away by a remapping swap, how long the pilot holds its
    own node at most for the agent to send the partner's VM there home (`[remap] partner_hold_s`)."""
    config_path: str = ""
    """The configuration file `vjob --config` named, handed to the processes the pilot starts
    (pilot.pause_drain's drainer) so they read the pilot's; empty: $VJOB_CONFIG or the site's."""
