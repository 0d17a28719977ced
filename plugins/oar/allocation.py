"""What OAR gave a job on each node: the cores of its cpuset, and their memory where the site
declares it as a resource property.

OAR writes `$OAR_NODEFILE` with one line per core of the job's cpuset on each host (`oarsub -l
nodes=2/core=4`: each host four times), so a host's line count is its CPU count. OAR has no
memory variable; memory is a resource property the operator defines. vjob reads `memcore`
(MiB per core: Grid'5000's name, `oarproperty -a memcore`) from `$OAR_RESOURCE_PROPERTIES_FILE`,
where OAR writes one line per resource of the job, e.g. (recorded on the test OAR 2.5.9):

    host = 'localhost' , core = '1' , memcore = '1024' , network_address = 'localhost' , ...

The job's memory on a host is the sum of its resources' `memcore` there. A site without the
property (or a host where one resource lacks it) gives no memory figure: the pilot keeps its
default and says so in its log.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from plugins.member_launch import node_file_nodes, short_name
from plugins.oar.adapter import ENVIRONMENT
from vjob.allocation import MAX_MEMORY_MIB, Allocation, cpus, memory_mib
from vjob.errors import InputError

PROPERTIES_FILE = "OAR_RESOURCE_PROPERTIES_FILE"
MEMORY_PROPERTY = "memcore"
"""MiB per core of a resource."""
MAX_PROPERTIES_BYTES = 4 << 20
_PAIR = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]{0,63}) = '([^'\n]{0,1024})'\s*(?:,|$)")


def resource_properties(text: str) -> list[dict[str, str]]:
    """Each resource line of OAR's properties file as {property: value}; a line that is not
    `key = 'value' , …` is refused naming the file's variable."""
    out: list[dict[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        props: dict[str, str] = {}
        pos = 0
        while pos < len(line.rstrip()):
            m = _PAIR.match(line, pos)
            if not m:
                raise InputError(f"${PROPERTIES_FILE}: line {number}: not OAR's `key = 'value' , ...` form")
            props[m.group(1)] = m.group(2)
            pos = m.end()
        out.append(props)
    return out


def memory_per_host(environ: Mapping[str, str]) -> dict[str, int]:
    """Host (as the node file names it) → the job's memory there (MiB), from `memcore`; hosts
    where a resource lacks it are left out; empty without the file."""
    path = environ.get(PROPERTIES_FILE, "").strip()
    if not path:
        return {}
    try:
        with Path(path).open("rb") as fh:
            raw = fh.read(MAX_PROPERTIES_BYTES + 1)
    except OSError as exc:
        raise InputError(f"${PROPERTIES_FILE} = {path[:80]!r}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_PROPERTIES_BYTES:
        raise InputError(f"${PROPERTIES_FILE}: more than {MAX_PROPERTIES_BYTES} bytes")
    totals: dict[str, int] = {}
    missing: set[str] = set()
    for props in resource_properties(raw.decode("utf-8", "replace")):
        host = short_name(props.get("network_address") or props.get("host") or "")
        if not host:
            continue
        if MEMORY_PROPERTY not in props:
            missing.add(host)
            continue
        totals[host] = totals.get(host, 0) + memory_mib(f"{PROPERTIES_FILE}: {MEMORY_PROPERTY}", props[MEMORY_PROPERTY])
        if totals[host] > MAX_MEMORY_MIB:
            raise InputError(f"${PROPERTIES_FILE}: host {host[:60]!r}: {totals[host]} MiB, past any node")
    return {host: mib for host, mib in totals.items() if host not in missing}


def allocations(environ: Mapping[str, str], node: str) -> dict[str, Allocation]:
    """Each host of the node file with its core count and, where the site declares `memcore`,
    its memory; empty without a node file."""
    if not environ.get(ENVIRONMENT.node_list):
        return {}
    lines = Counter(node_file_nodes(ENVIRONMENT, environ))
    memory = memory_per_host(environ)
    return {host: Allocation(cpus(ENVIRONMENT.node_list, str(n)), memory.get(host)) for host, n in lines.items()}
