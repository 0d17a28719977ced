"""The writer of the VMs' usage into the RMS's job record, for the site's RMS: the one place that
knows each RMS's writer (plugins/<rms>/accounting.py), for the node service's composition and a
pilot running as root.

Why here: provisioning/ and pilot/ must not pick an RMS module themselves; the writer is handed
to them (provisioning.node_service.usage_ops.install_writer, pilot.usage).
"""

from __future__ import annotations

from plugins.pbs.accounting import PbsUsageWriter
from plugins.slurm.accounting import SlurmUsageWriter
from plugins.slurm.adapter import SlurmAdapter
from plugins.slurm.commands import SlurmCommands
from provisioning.node_service.usage_ops import UsageWriter
from vjob.config import Config


def usage_writer(rms: str, config: Config) -> UsageWriter | None:
    """The writer for `rms`, or None where vjob writes no usage record yet (OAR:
    docs/realjobs.md "Accounting"). PBS's goes through a file its hook reads (plugins/pbs/accounting.py)."""
    if rms == "slurm":
        commands = SlurmCommands(
            bin_dir=config.slurm.bin_dir, conf=config.slurm.conf, timeout_s=min(config.agent.command_timeout_s, 15.0)
        )
        return SlurmUsageWriter(SlurmAdapter(commands))
    if rms == "pbs":
        return PbsUsageWriter()
    return None
