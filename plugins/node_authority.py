"""The node service's JobAuthority for the site's RMS (`[node] rms`, `vjob node-service --rms`).

Why here: provisioning/ knows no RMS (the layers of DESIGN.md), so the service is handed its
authority by the command that starts it, from this one place that knows every RMS's module.
"""

from __future__ import annotations

from plugins.oar import make_client
from plugins.oar.job_grant import OarJobAuthority
from plugins.pbs.adapter import PbsAdapter
from plugins.pbs.job_grant import PbsJobAuthority
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from plugins.slurm.job_grant import SlurmJobAuthority
from provisioning.node_service.grant import JobAuthority
from vjob.config import Config
from vjob.errors import ConfigError


def authority(rms: str, config: Config) -> JobAuthority:
    """The authority for `rms`, built from the site's configuration."""
    if rms == "slurm":
        commands = SlurmCommands(
            bin_dir=config.slurm.bin_dir, conf=config.slurm.conf, timeout_s=min(config.agent.command_timeout_s, 15.0)
        )
        return SlurmJobAuthority(SlurmAdapter(commands))
    if rms == "oar":
        return OarJobAuthority(make_client(config))
    if rms == "pbs":
        return PbsJobAuthority(PbsAdapter(config.pbs, timeout_s=min(config.agent.command_timeout_s, 15.0)))
    raise ConfigError(f"node service: rms {rms!r} has no job authority (known: slurm, oar, pbs)")
