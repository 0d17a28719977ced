"""What OAR gave a job on each node: the cores of its cpuset, read from the node file.

OAR writes `$OAR_NODEFILE` with one line per core of the job's cpuset on each host (`oarsub -l
nodes=2/core=4`: each host four times), so a host's line count is its CPU count. OAR puts no
memory in the job's environment (memory is a resource property an operator may define, not a
standard variable): the job's memory is unknown here and the pilot keeps its default (said in
its log).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from plugins.member_launch import node_file_nodes
from plugins.oar.adapter import ENVIRONMENT
from vjob.allocation import Allocation, cpus


def allocations(environ: Mapping[str, str], node: str) -> dict[str, Allocation]:
    """Each host of the node file with its core count; empty without a node file."""
    if not environ.get(ENVIRONMENT.node_list):
        return {}
    lines = Counter(node_file_nodes(ENVIRONMENT, environ))
    return {host: Allocation(cpus(ENVIRONMENT.node_list, str(n))) for host, n in lines.items()}
