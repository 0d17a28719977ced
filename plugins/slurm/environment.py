"""What Slurm tells vjob outside its commands: the job environment and the agent's wake file.

Why here: these are Slurm facts (variable names, where job_submit.lua can write), and the core
learns them only through the adapter's declared abilities (vjob.rms.Abilities).
"""

from __future__ import annotations

import os
from pathlib import Path

from vjob.rms import JobEnvironment

WAKE_NAME = "vjob-agent.wake"
"""The file job_submit.lua rewrites beside itself (so beside slurm.conf) on an interactive job."""
DEFAULT_CONF = "/etc/slurm/slurm.conf"
"""Where Debian's Slurm looks for slurm.conf when neither [slurm] conf nor $SLURM_CONF says."""

ENVIRONMENT = JobEnvironment(
    job_id="SLURM_JOB_ID",
    node_name="SLURMD_NODENAME",
    node_list="SLURM_JOB_NODELIST",
    restart_count="SLURM_RESTART_COUNT",
    restart_count_from_zero=True,  # Slurm sets it only from the first restart on
    script_name="slurm_script",
)


def wake_file(conf: str | os.PathLike[str] = "") -> Path:
    """The wake file job_submit.lua writes: it only knows its own directory, which is the one
    slurmctld loads it from, slurm.conf's. `conf` empty: the slurm.conf the commands would use."""
    return Path(conf or os.environ.get("SLURM_CONF") or DEFAULT_CONF).parent / WAKE_NAME
