"""What Slurm gave a job on each node, read from the batch script's environment.

Slurm 22.05 sets, in a batch job (sbatch(1), "OUTPUT ENVIRONMENT VARIABLES"; slurmd's
env_array_for_batch_job):
- `SLURM_CPUS_ON_NODE`: the CPUs of this node the job holds (`-c 2`: 2; `--exclusive`: all of
  the node's CPUs);
- `SLURM_JOB_CPUS_PER_NODE`: the same for every node, in Slurm's compressed form
  (`4(x2),2`), in the order of `SLURM_JOB_NODELIST`;
- `SLURM_MEM_PER_NODE` (with `--mem`) or `SLURM_MEM_PER_CPU` (with `--mem-per-cpu`, or the
  partition's or cluster's DefMemPerCPU), in MiB (Slurm's "MB" are MiB); the job's memory on a
  node is the first, or the second times the node's CPUs.
Neither is set for `--mem=0` or `--mem-per-cpu=0` ("all of the node", recorded on the dev
cluster), nor when the job asked for none and the site has no default (Slurm then gives it
the whole node too, with CR_*_Memory). The job's memory on each node is then read from Slurm
itself, once: `scontrol -d show job ID` lists, per group of nodes, `Nodes=node[1-2] CPU_IDs=0
Mem=4096` — what the allocation holds there (`job_memory`). A site that does not track memory
prints no `Mem=` (or 0): the memory is then unknown (pilot.sizing keeps its default and says so).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from plugins.slurm import hostlist
from plugins.slurm.commands import SlurmCommands, check_job_id
from plugins.slurm.environment import ENVIRONMENT
from vjob import log
from vjob.allocation import MAX_CPUS, MAX_MEMORY_MIB, Allocation, cpus, memory_mib
from vjob.errors import InputError, VjobError

CPUS_ON_NODE = "SLURM_CPUS_ON_NODE"
CPUS_PER_NODE = "SLURM_JOB_CPUS_PER_NODE"
MEM_PER_NODE = "SLURM_MEM_PER_NODE"
MEM_PER_CPU = "SLURM_MEM_PER_CPU"
_GROUP = re.compile(r"([0-9]{1,6})(?:\(x([0-9]{1,6})\))?")
_DETAIL = re.compile(r"^\s+Nodes=(\S{1,4096}) CPU_IDs=\S* Mem=([0-9]{1,12})(?:\s|$)", re.MULTILINE)
"""A node group of `scontrol -d show job`: its nodes and the job's memory on each (MiB)."""


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


def job_memory(detail: str) -> dict[str, int]:
    """Node → the job's memory there (MiB), from `scontrol -d show job` output; a group
    without memory (Mem=0: not tracked) is left out."""
    out: dict[str, int] = {}
    for m in _DETAIL.finditer(detail):
        if m.group(2) == "0":
            continue
        mib = memory_mib("scontrol -d show job: Mem", m.group(2))
        for name in hostlist.expand(m.group(1), "scontrol -d show job: Nodes"):
            out[name] = mib
    return out


def _asked_no_memory(environ: Mapping[str, str]) -> bool:
    """Whether the environment carries no memory figure (--mem=0, --mem-per-cpu=0, none asked)."""
    return all(environ.get(v, "").strip() in ("", "0") for v in (MEM_PER_NODE, MEM_PER_CPU))


def allocated_memory(environ: Mapping[str, str]) -> dict[str, int]:
    """The job's memory per node as Slurm holds it (`scontrol -d show job`), for a job whose
    environment gives none; empty when Slurm cannot say (no job id, scontrol failing: logged)."""
    raw = environ.get(ENVIRONMENT.job_id, "").strip()
    if not raw:
        return {}
    job = check_job_id(raw)
    try:
        scontrol = SlurmCommands(conf=environ.get("SLURM_CONF", ""), timeout_s=30)
        out = scontrol.run("scontrol", ["-d", "show", "job", job])
    except VjobError as exc:
        log.get("pilot").warning("cannot read the job's memory from Slurm", job=job, error=str(exc))
        return {}
    return job_memory(out)


def allocations(environ: Mapping[str, str], node: str) -> dict[str, Allocation]:
    """Each node's share of the job, `node` (this one) from SLURM_CPUS_ON_NODE; empty outside a
    job (no CPU figure at all): the pilot then sizes its VM as it always did. Without a memory
    figure in the environment, the memory is Slurm's record of the allocation (allocated_memory)."""
    out: dict[str, Allocation] = {}
    listed = environ.get(CPUS_PER_NODE, "").strip()
    nodelist = environ.get(ENVIRONMENT.node_list, "").strip()
    own = environ.get(CPUS_ON_NODE, "").strip()
    held = allocated_memory(environ) if (listed or own) and _asked_no_memory(environ) else {}
    if listed and nodelist:
        names = hostlist.expand(nodelist, f"${ENVIRONMENT.node_list}")
        figures = cpus_per_node(listed)
        if len(figures) != len(names):
            raise InputError(
                f"${CPUS_PER_NODE} = {listed[:60]!r}: {len(figures)} nodes, ${ENVIRONMENT.node_list} has {len(names)}"
            )
        out = {name: Allocation(n, held.get(name, _memory(environ, n))) for name, n in zip(names, figures, strict=True)}
    if own:
        n = cpus(CPUS_ON_NODE, own)
        out[node] = Allocation(n, held.get(node, _memory(environ, n)))
    return out
