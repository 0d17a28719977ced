"""Configuration: one TOML file, validated at load, with embedded defaults for a first run.

The package's names are its API (`from vjob.config import Config, parse, load, ...`); its
modules say what they hold: `section` the base model, `site` and `policy` the kernel's own
sections, `composed` the whole file with the sections kept beside their code (`[slurm]`, `[pbs]`,
`[saline]`, `[tune]`; why, in its docstring), `toml_file` the reading, `reference` the docs page.
"""

from vjob.config.composed import Config, load, masked, parse
from vjob.config.policy import PriorityConfig, PriorityWeights, RemapConfig, SchedulingConfig
from vjob.config.reference import reference
from vjob.config.section import Section
from vjob.config.site import AgentConfig, ProvisioningConfig
from vjob.config.toml_file import parse_toml

__all__ = [
    "AgentConfig",
    "Config",
    "PriorityConfig",
    "PriorityWeights",
    "ProvisioningConfig",
    "RemapConfig",
    "SchedulingConfig",
    "Section",
    "load",
    "masked",
    "parse",
    "parse_toml",
    "reference",
]
