"""`[slurm]`: where the Slurm commands and slurm.conf are, the site-factor scale and the image
list, read by this package's adapter (composed into the one file by vjob.config.composed).
"""

from __future__ import annotations

from pydantic import Field

from vjob.config import Section


class SlurmConfig(Section):
    bin_dir: str = ""
    """Directory of the Slurm commands; empty means search PATH."""
    site_factor_max: int = Field(1_000_000, ge=1)
    """The site factor a priority of 1.0 maps to (Slurm's PriorityWeightSite scale)."""
    conf: str = ""
    """slurm.conf the commands use (passed as SLURM_CONF); empty means Slurm's own default."""
    image_list: str = ""
    """The OS image list job_submit.lua reads (vjob-images.list next to slurm.conf); empty: none."""
