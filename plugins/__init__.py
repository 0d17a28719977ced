"""RMS adapters (Slurm, Torque/OpenPBS, OAR) that observe the cluster into a ClusterView and
carry out decisions, plus the files an operator installs into each RMS (submit filters,
hooks, prolog/epilog).

`make_adapter(rms, config)` is the one registry: the agent, `vjob prio --rms` and the dev kit
get an adapter by the RMS's name and learn what it can do from its `abilities`
(vjob.rms.Abilities), never by probing.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING

from vjob.errors import UsageError

if TYPE_CHECKING:  # names for the signatures only: `vjob deploy --help` then loads no pydantic
    from vjob.allocation import Allocation
    from vjob.config import Config
    from vjob.rms import JobEnvironment, RMSAdapter

RMS_PACKAGES = {"slurm": "plugins.slurm", "pbs": "plugins.pbs", "oar": "plugins.oar"}
"""RMS name → the package holding its adapter, `parse_output` and installable files."""


def rms_package(rms: str) -> ModuleType:
    """The adapter package of `rms`, imported only when asked for (each pulls its own clients)."""
    if rms not in RMS_PACKAGES:
        raise UsageError(f"--rms {rms!r}: must be one of {', '.join(sorted(RMS_PACKAGES))}")
    return importlib.import_module(RMS_PACKAGES[rms])


def make_adapter(rms: str, config: Config) -> RMSAdapter:
    """The live adapter of `rms`, configured from `config`."""
    adapter: RMSAdapter = rms_package(rms).make_adapter(config)
    return adapter


def job_environment(rms: str) -> JobEnvironment:
    """The variables a job of `rms` finds in its environment (for the in-job pilot)."""
    env: JobEnvironment = rms_package(rms).ENVIRONMENT
    return env


def job_allocations(rms: str, environ: Mapping[str, str], node: str) -> dict[str, Allocation]:
    """What `rms` gave the job on each of its nodes, read from the job's environment
    (plugins/<rms>/allocation.py); empty when the environment says nothing of it."""
    rms_package(rms)  # refuses an unknown RMS
    reader = importlib.import_module(f"{RMS_PACKAGES[rms]}.allocation")
    found: dict[str, Allocation] = reader.allocations(environ, node)
    return found


__all__ = ["RMS_PACKAGES", "job_allocations", "job_environment", "make_adapter", "rms_package"]
