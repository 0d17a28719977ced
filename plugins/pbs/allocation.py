"""What PBS gave a job on each node, read from the job's environment.

OpenPBS sets `NCPUS` (the `ncpus` of the job's chunk on this node; `OMP_NUM_THREADS` follows
it); PBS Pro and Torque sites set `PBS_NCPUS` or `PBS_NUM_PPN`; the memory of a chunk reaches
the job as `PBS_RESC_MEM` (bytes per node; Torque's `TORQUE_RESC_MEM`), as the MetaCentrum
record in ../shared/data/fixtures/openpbs shows beside `exec_vnode=(n:ncpus=2:mem=4194304kb)`.
A PBS job's chunks are the same on every node (`select=2:ncpus=2:mem=4gb`), so each node of the
node file gets this node's figures. No memory variable: the job's memory is unknown here.
"""

from __future__ import annotations

from collections.abc import Mapping

from plugins.member_launch import node_file_nodes
from plugins.pbs.adapter import ENVIRONMENT
from vjob.allocation import Allocation, cpus, memory_mib

CPU_VARS = ("NCPUS", "PBS_NCPUS", "PBS_NUM_PPN")
"""The CPU count of this node's chunk, first one set wins."""
MEM_VARS = ("PBS_RESC_MEM", "TORQUE_RESC_MEM")
"""The memory of this node's chunk in bytes, first one set wins."""


def allocations(environ: Mapping[str, str], node: str) -> dict[str, Allocation]:
    """Every node of the job with this node's chunk; empty when no CPU variable is set."""
    var = next((v for v in CPU_VARS if environ.get(v, "").strip()), "")
    if not var:
        return {}
    n = cpus(var, environ[var])
    mem_var = next((v for v in MEM_VARS if environ.get(v, "").strip()), "")
    memory = memory_mib(mem_var, environ[mem_var], unit_bytes=1) if mem_var else None
    share = Allocation(n, memory)
    nodes = node_file_nodes(ENVIRONMENT, environ) if environ.get(ENVIRONMENT.node_list) else []
    return {name: share for name in [*nodes, node]}
