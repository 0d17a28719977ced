"""Slurm's word on a job for the node service: who owns it, whether it runs, on which nodes,
with how many CPUs and how much memory on each (provisioning.node_service.grant.JobAuthority).

Why JSON only: the owner's uid decides what root does for a caller, so it must come from a
field a job's name, comment or path cannot imitate (parse_json's module docstring); Slurm before
20.11 has no --json and is refused with a message. Where the job comes from:
- 23.02 and later: `scontrol --json=vX show job J` (one job);
- 20.11-22.05: `squeue --json`, which ignores every filter (notes: slurm.md), so the whole
  document is fetched at most once a second and shared by the requests of that second.
Per-node figures come from the job's `job_resources`, in the three shapes Slurm printed:
- openapi v0.0.37: `allocated_nodes` is {"0": {cpus, memory}, ...}, indexed in `nodes` order;
- openapi v0.0.38 to data_parser v0.0.40: a list of {nodename, sockets: {s: {cores: {c:
  "allocated"}}}, memory_allocated}, CPUs being the allocated cores (times the job's CPUs per
  allocated core, for nodes with several threads per core);
- data_parser v0.0.41 and later: `nodes.allocation` = [{name, cpus: {count}, memory: {allocated}}].
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from plugins.slurm import hostlist, parse_json
from plugins.slurm.adapter import SlurmAdapter, _load
from plugins.slurm.commands import check_job_id
from provisioning.node_service.grant import Grant
from vjob.errors import CommandError, InputError

SHARED_FOR_S = 1.0
"""How long one `squeue --json` document answers every request (Slurm 20.11-22.05)."""


class SlurmJobAuthority:
    """JobAuthority over the Slurm client commands (run as root, with the site's slurm.conf)."""

    rms = "slurm"

    def __init__(self, adapter: SlurmAdapter) -> None:
        self.adapter = adapter
        self._lock = threading.Lock()
        self._shared: tuple[float, dict[str, Any]] | None = None

    def grant(self, job: str, node: str) -> Grant | None:
        check_job_id(job)
        return grant_of(self._document(job), job, node, source=f"slurm job {job}")

    def owned(self, job: str, node: str) -> Grant | None:
        check_job_id(job)
        return grant_of(self._document(job), job, node, source=f"slurm job {job}", running=False)

    def node_addresses(self, nodes: Sequence[str]) -> dict[str, str]:
        """Each node's NodeAddr (an address or a host name, as slurm.conf says): the far ends of a
        job's tunnel (provisioning.node_service.tunnel). `scontrol --json show node` from 23.02,
        `sinfo --json` before (every node: 22.05 ignores its filters)."""
        parser = self.adapter.data_parser()
        if parser:
            command, args = "scontrol", [f"--json={parser}", "show", "node"]
        elif self.adapter.uses_json:
            command, args = "sinfo", ["--json"]
        else:
            raise CommandError(["sinfo", "--json"], "Slurm before 20.11 prints no JSON: the node service needs it")
        source = f"{command} {args[0]}"
        return addresses_of(_load(self.adapter.cmd.run(command, args), source), nodes, source=source)

    def _document(self, job: str) -> dict[str, Any]:
        parser = self.adapter.data_parser()
        if parser:
            flag = f"--json={parser}"
            try:
                out = self.adapter.cmd.run("scontrol", [flag, "show", "job", job], job=job)
            except CommandError as exc:
                if "Invalid job id" in str(exc):
                    return {"meta": {"plugin": {"data_parser": parser}}, "jobs": []}
                raise
            return _load(out, f"scontrol {flag}")
        if not self.adapter.uses_json:
            raise CommandError(["squeue", "--json"], "Slurm before 20.11 prints no JSON: the node service needs it")
        with self._lock:
            if self._shared is None or time.monotonic() - self._shared[0] > SHARED_FOR_S:
                self._shared = (time.monotonic(), _load(self.adapter.cmd.run("squeue", ["--json"]), "squeue --json"))
            return self._shared[1]


def grant_of(doc: Mapping[str, Any], job: str, node: str, *, source: str, running: bool = True) -> Grant | None:
    """The grant of `job` on `node` from a squeue/scontrol JSON document: None when the job is
    not there, not RUNNING, or does not hold `node`; InputError when its record is malformed.
    `running=False`: the job in any state (JobAuthority.owned), no CPUs or memory where it
    does not run now."""
    parse_json.check_layout(doc, source=source)
    items = doc.get("jobs")
    if not isinstance(items, list):
        raise InputError(f"{source}: no 'jobs' list")
    found = [item for item in items if isinstance(item, Mapping) and _is(item, job, source)]
    if len(found) != 1:
        return None
    item = found[0]
    where = f"{source}: job {job}"
    words = parse_json._words(item, "job_state", where)
    names = hostlist.expand(parse_json._get(item, "nodes", str, where, ""), f"{where}.nodes")
    runs_here = bool(words) and words[0] == "RUNNING" and "COMPLETING" not in words and node in names
    if running and not runs_here:
        return None
    cpus, memory = 0, 0
    if runs_here:
        shares = node_shares(item, names, where)
        if node not in shares:
            raise InputError(f"{where}: job_resources say nothing of node {node!r}, which the job holds")
        cpus, memory = shares[node]
    uid = parse_json._get(item, "user_id", int, where, None)
    gid = parse_json._get(item, "group_id", int, where, None)
    if uid is None or gid is None or uid < 0 or gid < 0:
        raise InputError(f"{where}: user_id {uid!r} / group_id {gid!r}: expected ids")
    return Grant(
        rms="slurm",
        job=job,
        uid=uid,
        gid=gid,
        user=parse_json._get(item, "user_name", str, where, "")[:64],
        node=node,
        nodes=names,
        cpus=cpus,
        memory_mib=memory,
    )


def addresses_of(doc: Mapping[str, Any], nodes: Sequence[str], *, source: str) -> dict[str, str]:
    """NodeAddr of each of `nodes` in a `sinfo --json` / `scontrol --json show node` document
    (its `nodes` list of {name, address}); InputError naming a node it lacks or a malformed one."""
    parse_json.check_layout(doc, source=source)
    items = doc.get("nodes")
    if not isinstance(items, list):
        raise InputError(f"{source}: no 'nodes' list")
    wanted, found = set(nodes), {}
    for item in items:
        name = item.get("name") if isinstance(item, Mapping) else None
        if name not in wanted:
            continue
        address = parse_json._get(item, "address", str, f"{source}: node {name}", "")
        if not address or len(address) > 253:
            raise InputError(f"{source}: node {name} has no usable address ({address[:60]!r})")
        found[name] = address
    missing = sorted(wanted - set(found))
    if missing:
        raise InputError(f"{source}: no record of node(s) {', '.join(missing[:8])}")
    return found


def _is(item: Mapping[str, Any], job: str, source: str) -> bool:
    """Whether the record is `job`: 123 by job_id, 123_4 by array job and task, 123+1 by
    heterogeneous job and offset."""
    where = f"{source}: a job"
    if "_" in job:
        array, task = job.split("_")
        return parse_json._get(item, "array_job_id", int, where, None) == int(array) and parse_json._get(
            item, "array_task_id", int, where, None
        ) == int(task)
    if "+" in job:
        het, offset = job.split("+")
        return parse_json._get(item, "het_job_id", int, where, None) == int(het) and parse_json._get(
            item, "het_job_offset", int, where, None
        ) == int(offset)
    return parse_json._get(item, "job_id", int, where, None) == int(job)


def node_shares(item: Mapping[str, Any], names: tuple[str, ...], where: str) -> dict[str, tuple[int, int]]:
    """Node → (CPUs, memory MiB) of the job there, from its job_resources (module docstring)."""
    res = item.get("job_resources")
    if not isinstance(res, Mapping):
        raise InputError(f"{where}: a running job without job_resources")
    if isinstance(res.get("nodes"), Mapping):
        return _from_allocation(res["nodes"], where)
    listed = res.get("allocated_nodes")
    if isinstance(listed, Mapping):  # openapi v0.0.37: indexed in the order of `nodes`
        entries = []
        for key, entry in listed.items():
            if not (isinstance(key, str) and key.isdigit() and int(key) < len(names)):
                raise InputError(f"{where}: allocated_nodes key {str(key)[:20]!r} is not an index of the nodes")
            entries.append((names[int(key)], entry))
    elif isinstance(listed, list):
        entries = [(_name(entry, where), entry) for entry in listed]
    else:
        raise InputError(f"{where}: job_resources without allocated_nodes")
    return _from_entries(entries, parse_json._get(item, "cpus", int, where, 0) or 0, where)


def _name(entry: Any, where: str) -> str:
    name = entry.get("nodename") if isinstance(entry, Mapping) else None
    if not isinstance(name, str) or not hostlist.NODE_NAME.fullmatch(name):
        raise InputError(f"{where}: allocated_nodes entry without a node name")
    return name


def _from_entries(entries: list[tuple[str, Any]], job_cpus: int, where: str) -> dict[str, tuple[int, int]]:
    cores: dict[str, int] = {}
    out: dict[str, tuple[int, int]] = {}
    for name, entry in entries:
        if not isinstance(entry, Mapping):
            raise InputError(f"{where}: allocated_nodes[{name}] is not an object")
        memory = parse_json._get(entry, "memory_allocated", int, where, None)
        if memory is None:
            memory = parse_json._get(entry, "memory", int, where, 0)
        cpus = parse_json._get(entry, "cpus", int, where, None)
        if cpus is None:
            cores[name] = _allocated_cores(entry.get("sockets"), where)
        out[name] = (cpus or 0, max(0, memory or 0))
    total = sum(cores.values())
    for name, count in cores.items():
        # Cores, not CPUs: with several threads per core the job's CPUs are a multiple of them.
        per_core = job_cpus // total if total and job_cpus >= total else 1
        out[name] = (count * per_core, out[name][1])
    if any(cpus <= 0 for cpus, _ in out.values()):
        raise InputError(f"{where}: a node of the job without allocated CPUs")
    return out


def _allocated_cores(sockets: Any, where: str) -> int:
    if not isinstance(sockets, Mapping):
        raise InputError(f"{where}: allocated_nodes entry without sockets")
    count = 0
    for socket in sockets.values():
        cores = socket.get("cores") if isinstance(socket, Mapping) else None
        if not isinstance(cores, Mapping):
            raise InputError(f"{where}: a socket without cores")
        count += sum(1 for state in cores.values() if isinstance(state, str) and state.startswith("allocated"))
    return count


def _from_allocation(nodes: Mapping[str, Any], where: str) -> dict[str, tuple[int, int]]:
    """data_parser v0.0.41+: job_resources.nodes.allocation."""
    listed = nodes.get("allocation")
    if not isinstance(listed, list):
        raise InputError(f"{where}: job_resources.nodes without an allocation list")
    out: dict[str, tuple[int, int]] = {}
    for entry in listed:
        if not isinstance(entry, Mapping):
            raise InputError(f"{where}: job_resources.nodes.allocation entry is not an object")
        name = parse_json._get(entry, "name", str, where, "")
        if not hostlist.NODE_NAME.fullmatch(name):
            raise InputError(f"{where}: allocation entry name {name[:64]!r} is not a node name")
        cpus = parse_json._get(_object(entry, "cpus", where), "count", int, where, 0)
        memory = parse_json._get(_object(entry, "memory", where), "allocated", int, where, 0)
        if not cpus or cpus <= 0:
            raise InputError(f"{where}: node {name} of the job without allocated CPUs")
        out[name] = (cpus, max(0, memory or 0))
    return out


def _object(entry: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = entry.get(key) or {}
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: allocation entry {key} is not an object")
    return value
