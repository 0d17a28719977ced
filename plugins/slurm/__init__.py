"""Slurm adapter: observe jobs and nodes through Slurm's commands, act through scontrol.

`parse_output(kind, text, source=...)` reads recorded command output (for `vjob rms parse`);
`make_adapter(config)` returns the live adapter the agent uses (`vjob agent --rms slurm`).
"""

from plugins.slurm.adapter import SlurmAdapter, make_adapter
from plugins.slurm.environment import ENVIRONMENT
from plugins.slurm.parse import parse_output

__all__ = ["ENVIRONMENT", "SlurmAdapter", "make_adapter", "parse_output"]
