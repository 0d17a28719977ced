"""What Slurm gave a job on each node, read from the batch script's environment.

Slurm 22.05 sets, in a batch job (sbatch(1), "OUTPUT ENVIRONMENT VARIABLES"; slurmd's
env_array_for_batch_job):
- `SLURM_CPUS_ON_NODE`: the CPUs of this node the job holds (`-c 2`: 2; `--exclusive`: all of
  the node's CPUs);
- `SLURM_JOB_CPUS_PER_NODE`: the same for every node, in Slurm's compressed form
  (`4(x2),2`), in the order of `SLURM_JOB_NODELIST`;
- `SLURM_MEM_PER_NODE` (with `--mem`) or `SLURM_MEM_PER_CPU` (with `--mem-per-cpu`, or the
  partition's or cluster's DefMemPerCPU), in MiB (Slurm's "MB" are MiB). Neither is set when the
  job asked for no memory and the site has no default: the job's memory is then unknown here
  (pilot.sizing keeps its default and says so). `--mem=0` ("all of the node") reads as unknown
  too: the environment does not carry the node's size.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from plugins.slurm import hostlist
from plugins.slurm.environment import ENVIRONMENT
from vjob.allocation import MAX_CPUS, MAX_MEMORY_MIB, Allocation, cpus, memory_mib
from vjob.errors import InputError

CPUS_ON_NODE = "SLURM_CPUS_ON_NODE"
CPUS_PER_NODE = "SLURM_JOB_CPUS_PER_NODE"
MEM_PER_NODE = "SLURM_MEM_PER_NODE"
MEM_PER_CPU = "SLURM_MEM_PER_CPU"
_GROUP = re.compile(r"([0-9]{1,6})(?:\(x([0-9]{1,6})\))?")


def cpus_per_node(raw: str) -> list[int]:
    """`4(x2),2` → [4, 4, 2]: SLURM_JOB_CPUS_PER_NODE expanded, one figure per node."""
    out: list[int] = []
    for group in raw.split(","):
        m = _GROUP.fullmatch(group.strip())
        if not m:
            raise InputError(f"${CPUS_PER_NODE} = {raw[:60]!r}: not Slurm's N(xM),… form")
        n = cpus(CPUS_PER_NODE, m.group(1))
        repeat = int(m.group(2) or 1)
        if not 1 <= repeat <= MAX_CPUS or len(out) + repeat > 65536:
            raise InputError(f"${CPUS_PER_NODE} = {raw[:60]!r}: too many nodes")
        out.extend([n] * repeat)
    return out


def _memory(environ: Mapping[str, str], node_cpus: int) -> int | None:
    """The job's memory on a node holding `node_cpus` of its CPUs; None when Slurm did not say."""
    per_node = environ.get(MEM_PER_NODE, "").strip()
    if per_node and per_node != "0":
        return memory_mib(MEM_PER_NODE, per_node)
    per_cpu = environ.get(MEM_PER_CPU, "").strip()
    if per_cpu and per_cpu != "0":
        total = memory_mib(MEM_PER_CPU, per_cpu) * node_cpus
        if total > MAX_MEMORY_MIB:
            raise InputError(f"${MEM_PER_CPU} = {per_cpu[:40]!r}: × {node_cpus} CPUs is {total} MiB, past any node")
        return total
    return None


def allocations(environ: Mapping[str, str], node: str) -> dict[str, Allocation]:
    """Each node's share of the job, `node` (this one) from SLURM_CPUS_ON_NODE; empty outside a
    job (no CPU figure at all): the pilot then sizes its VM as it always did."""
    out: dict[str, Allocation] = {}
    listed = environ.get(CPUS_PER_NODE, "").strip()
    nodelist = environ.get(ENVIRONMENT.node_list, "").strip()
    if listed and nodelist:
        names = hostlist.expand(nodelist, f"${ENVIRONMENT.node_list}")
        figures = cpus_per_node(listed)
        if len(figures) != len(names):
            raise InputError(
                f"${CPUS_PER_NODE} = {listed[:60]!r}: {len(figures)} nodes, ${ENVIRONMENT.node_list} has {len(names)}"
            )
        out = {name: Allocation(n, _memory(environ, n)) for name, n in zip(names, figures, strict=True)}
    own = environ.get(CPUS_ON_NODE, "").strip()
    if own:
        n = cpus(CPUS_ON_NODE, own)
        out[node] = Allocation(n, _memory(environ, n))
    return out
