"""`[slurm]`: where the Slurm commands and slurm.conf are, the site-factor scale, the image
list and the partitions whose every job is a vjob, read by this package's adapter and
job_submit.lua (composed into the one file by vjob.config.composed).
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from vjob.config import Section

PARTITION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A partition name job_submit.lua's reader takes (Slurm's own are a subset in practice)."""
IMAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""plugins.slurm.images.IMAGE_NAME (not imported: this module stays light)."""


class SlurmConfig(Section):
    bin_dir: str = ""
    """Directory of the Slurm commands; empty means search PATH."""
    site_factor_max: int = Field(1_000_000, ge=1)
    """The site factor a priority of 1.0 maps to (Slurm's PriorityWeightSite scale)."""
    order_share: float = Field(0.5, ge=0.0, le=1.0, allow_inf_nan=False)
    """How much of the order within a tier vjob owns beside the site's multifactor (fair
    share, age, QOS): 0 leaves each tier to the site's factors, 0.5 weighs vjob's UBIS
    priority as much as all of them together, 1 sends vjob's whole order over
    0..site_factor_max (the former rule: the site's factors then matter only between
    neighbours). Below 1 the tiers go in bands above the site's PriorityWeight* sum
    (docs/slurm.md, "vjob's order and the site's priority")."""
    resync_every: int = Field(30, ge=0, le=100_000)
    """Ticks between two reads of every job's JSON. In between, the agent lists the jobs in
    numbers only (`squeue -o`) and reads the JSON of the new and changed ones
    (docs/slurm-agent.md, "At a site's size"); 0 or 1: every job's JSON at every tick."""
    json_read_share: float = Field(0.2, gt=0.0, le=1.0, allow_inf_nan=False)
    """The most of the time `squeue --json` may run for the agent: after a read of the jobs'
    JSON that took T seconds, the next one waits T × (1/share − 1), new jobs held back and
    changed ones kept as last read until then; an interactive job (job_submit.lua's wake) or
    a state change the listing cannot apply reads at once. On Slurm 20.11-22.05 every read
    prints every job (12.7 s of squeue's CPU at 120,000 jobs); 1: read at every tick
    (docs/slurm-agent.md, "At a site's size")."""
    json_read_share_woken: float = Field(0.5, gt=0.0, le=1.0, allow_inf_nan=False)
    """The same share for the read a wake asks for (job_submit.lua accepted an interactive job):
    at 0.5 it may follow the last read after as long as that one took, so interactive jobs
    coming at every tick keep squeue busy half the time, not all of it; 1: read at once."""
    conf: str = ""
    """slurm.conf the commands use (passed as SLURM_CONF); empty means Slurm's own default."""
    image_list: str = ""
    """The OS image list job_submit.lua reads (vjob-images.list next to slurm.conf); empty: none."""
    vjob_partitions: dict[str, str] = Field(default_factory=dict)
    """Partitions whose every batch job runs in a VM, each with its default image, e.g.
    `{batch = "debian12"}`: no `#VJOB` line needed. The agent writes them at its start into
    vjob-partitions.conf beside slurm.conf, which job_submit.lua reads (docs/realjobs.md)."""
    allow_opt_out: bool = False
    """Whether a job of a vjob partition may run bare with a `#VJOB off` line; if not, such a
    job is refused at submission with a message saying so."""

    @field_validator("vjob_partitions")
    @classmethod
    def _partitions(cls, value: dict[str, str]) -> dict[str, str]:
        for part, image in value.items():
            if not PARTITION_NAME.fullmatch(part):
                raise ValueError(f"partition {part[:80]!r}: 1-64 letters, digits, '.', '_' or '-'")
            if not IMAGE_NAME.fullmatch(image):
                raise ValueError(f"partition {part}: image {image[:80]!r}: 1-64 letters, digits, '.', '_' or '-'")
        return value
