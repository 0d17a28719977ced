"""squeue/sinfo/scontrol --json (openapi v0.0.37-38, data_parser v0.0.39-42) to model objects.

Why dispatch on the declared layout: Slurm changes its JSON between releases. openapi
v0.0.37 (21.08) and v0.0.38 (22.05) print plain numbers and a job_state word; the data_parser
layouts of 23.02 and later (v0.0.39 in 23.02, v0.0.40 in 23.11, v0.0.41 in 24.05, v0.0.42 in
24.11) wrap numbers as {"set": true, "infinite": false, "number": N}, make job_state and a
node's state lists (from v0.0.40), and `sinfo --json` lists {node, nodes, cpus, memory} groups
under "sinfo" instead of nodes. The fields vjob reads are read the same way in all of them
once a number object is unwrapped; a layout not listed in SUPPORTED is refused with a message
rather than guessed.

Why JSON is the trusted path: every value is its own JSON string, so a job name or a comment
cannot pose as another field (see parse_text for the text path's defences).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from plugins.slurm import hostlist
from plugins.slurm.images import parse_deadline_tag, parse_tag, requested_image
from plugins.slurm.states import job_state, node_state, tres_memory_mb
from vjob.errors import InputError
from vjob.model import Job, JobClass, JobState, Node

OPENAPI = ("openapi/v0.0.37", "openapi/v0.0.38")
DATA_PARSERS = ("data_parser/v0.0.39", "data_parser/v0.0.40", "data_parser/v0.0.41", "data_parser/v0.0.42")
SUPPORTED = OPENAPI + DATA_PARSERS
_DATA_PARSER = re.compile(r"(?:data_parser/)?(v0\.0\.[0-9]{2})(?:\+[a-z_+]*)?")


def layout(doc: Mapping[str, Any], *, source: str) -> str:
    """The layout a Slurm JSON document declares ('openapi/v0.0.38', 'data_parser/v0.0.40').

    23.02's squeue says meta.plugins.data_parser; 23.11 and later say meta.plugin.data_parser
    (with meta.plugin.type naming the REST plugin, e.g. 'openapi/slurmctld'); 21.08-22.05 say
    only meta.plugin.type. The data_parser, where given, is what fixes the layout.
    """
    meta = doc.get("meta")
    if not isinstance(meta, Mapping):
        raise InputError(f"{source}: JSON without a 'meta' object: not squeue/sinfo --json output")
    for holder in (meta.get("plugin"), meta.get("plugins")):
        if isinstance(holder, Mapping) and isinstance(holder.get("data_parser"), str) and holder["data_parser"]:
            found = _DATA_PARSER.fullmatch(holder["data_parser"])
            if not found:
                said = holder["data_parser"][:40]
                raise InputError(f"{source}: meta data_parser {said!r} is not a version vjob knows")
            return f"data_parser/{found.group(1)}"
    plugin = meta.get("plugin")
    if isinstance(plugin, Mapping) and isinstance(plugin.get("type"), str):
        return str(plugin["type"])[:64]
    raise InputError(f"{source}: meta declares no plugin type or data_parser version")


def release(doc: Mapping[str, Any]) -> str:
    """The Slurm release an output reports ('23.11.1'), '' when it does not say."""
    meta = doc.get("meta")
    if not isinstance(meta, Mapping):
        return ""
    slurm = meta.get("slurm") or meta.get("Slurm")
    if isinstance(slurm, Mapping) and isinstance(slurm.get("release"), str):
        return slurm["release"][:32]
    return ""


def check_layout(doc: Mapping[str, Any], *, source: str) -> str:
    found = layout(doc, source=source)
    if found not in SUPPORTED:
        said = release(doc)
        raise InputError(
            f"{source}: JSON layout {found!r}{f' (Slurm {said})' if said else ''} is not supported "
            f"(supported: {', '.join(SUPPORTED)}); ask for one explicitly, e.g. `squeue --json=v0.0.42`, "
            "or use `scontrol show job -o` / `scontrol show node -o` output"
        )
    return found


def jobs(doc: Mapping[str, Any], *, source: str) -> list[Job]:
    check_layout(doc, source=source)
    items = doc.get("jobs")
    if not isinstance(items, list):
        raise InputError(f"{source}: no 'jobs' list: this is not squeue --json output")
    return [_job(item, f"{source}: jobs[{i}]") for i, item in enumerate(items)]


def nodes(doc: Mapping[str, Any], *, source: str) -> list[Node]:
    """Nodes of `scontrol show node --json` / openapi `sinfo --json` ("nodes"), or of the
    data_parser `sinfo --json` groups ("sinfo"); one entry per node name."""
    check_layout(doc, source=source)
    seen: dict[str, Node] = {}
    if "sinfo" in doc:
        groups = doc.get("sinfo")
        if not isinstance(groups, list):
            raise InputError(f"{source}: 'sinfo' is not a list")
        for i, group in enumerate(groups):
            for node in _sinfo_group(group, f"{source}: sinfo[{i}]"):
                seen.setdefault(node.name, node)
        return list(seen.values())
    items = doc.get("nodes")
    if not isinstance(items, list):
        raise InputError(f"{source}: no 'nodes' list: this is not sinfo/scontrol show node --json output")
    for i, item in enumerate(items):
        node = _node(item, f"{source}: nodes[{i}]")
        seen.setdefault(node.name, node)
    return list(seen.values())


def job(item: Any, where: str) -> Job:
    """One element of a "jobs" array (plugins.slurm.json_stream reads them one at a time)."""
    return _job(item, where)


def node(item: Any, where: str) -> Node:
    """One element of a "nodes" array (plugins.slurm.json_stream reads them one at a time)."""
    return _node(item, where)


def job_id(item: Any, where: str) -> int:
    """The id of one element of a "jobs" array, checked as `job` checks it, nothing else read:
    the streaming reader drops the jobs it was not asked for after this look."""
    if not isinstance(item, Mapping):
        raise InputError(f"{where}: expected an object")
    found = _get(item, "job_id", int, where)
    if found is None:
        raise InputError(f"{where}: missing job_id")
    if found <= 0:
        raise InputError(f"{where}.job_id = {found}: expected a positive number")
    return int(found)


def priority_of(item: Mapping[str, Any], where: str) -> int:
    """A job's priority as `job` reads it (1 when not set): 0 is held."""
    return int(_get(item, "priority", int, where, 1))


def _get(item: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    value = item.get(key, default)
    if isinstance(value, Mapping) and "number" in value and kind is not Mapping:
        # {"set": bool, "infinite": bool, "number": N}: Slurm's newer way of saying "maybe a number"
        value = value["number"] if value.get("set", True) is True and value.get("infinite", False) is False else None
    if value is None:
        return default
    if isinstance(value, bool) and kind is not bool:
        raise InputError(f"{where}.{key} = {value!r}: expected {getattr(kind, '__name__', kind)}")
    if not isinstance(value, kind):
        raise InputError(f"{where}.{key} = {str(value)[:60]!r}: expected {getattr(kind, '__name__', kind)}")
    return value


def _words(item: Mapping[str, Any], key: str, where: str) -> list[str]:
    """A state that is a word ('RUNNING', v0.0.37-39) or a list of words (['IDLE', 'DRAIN'], v0.0.40+)."""
    value = item.get(key, "")
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [v[:64] for v in value]
    raise InputError(f"{where}.{key} = {str(value)[:60]!r}: expected a state word or a list of them")


def _time(item: Mapping[str, Any], key: str, where: str) -> float | None:
    value = _get(item, key, int, where, 0)
    return float(value) if value > 0 else None


def _job(item: Any, where: str) -> Job:
    number = job_id(item, where)
    where = f"{where} (job {number})"
    words = _words(item, "job_state", where)
    state = job_state(words[0] if words else "", _get(item, "state_reason", str, where, ""), where=where)
    if state is JobState.PENDING and (priority_of(item, where) == 0 or _get(item, "hold", bool, where, False)):
        state = JobState.HELD  # held jobs have priority 0 whatever the reason says
    batch = _get(item, "batch_flag", bool, where, True)
    tag = parse_tag(_get(item, "admin_comment", str, where, ""))
    try:
        os_image = tag[1] if tag else requested_image(_get(item, "comment", str, where, ""))
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    cpus = _get(item, "cpus", int, where, 1) or 1
    node_count = _get(item, "node_count", int, where, 1) or 1
    if cpus < 0 or node_count < 0:
        raise InputError(f"{where}: cpus = {cpus}, node_count = {node_count}: expected counts")
    cores = -(-cpus // node_count)
    memory = _memory_mb(item, cores, node_count, where)
    limit = _get(item, "time_limit", int, where, None)
    running = state in (JobState.RUNNING, JobState.SUSPENDED)
    finished = state.finished
    return Job(
        id=str(number),
        user=_get(item, "user_name", str, where, "") or str(_get(item, "user_id", int, where, "")),
        job_class=JobClass.BATCH if batch else JobClass.INTERACTIVE,
        rms="slurm",
        account=_get(item, "account", str, where, ""),
        nodes=node_count,
        cores=cores,
        memory_mb=memory,
        os_image=os_image,
        submit_time=_time(item, "submit_time", where) or 0.0,
        start_time=_time(item, "start_time", where) if (running or finished) else None,
        end_time=_time(item, "end_time", where) if finished else None,
        walltime=float(limit) * 60 if limit and limit > 0 else None,
        state=state,
        allocated_nodes=hostlist.expand(_get(item, "nodes", str, where, ""), f"{where}.nodes") if running else (),
        deadline=_time(item, "deadline", where) or parse_deadline_tag(_get(item, "admin_comment", str, where, "")),
    )


def _memory_mb(item: Mapping[str, Any], cores: int, node_count: int, where: str) -> int:
    """Memory per node: asked per node, per CPU, or the job's TRES total shared by its nodes."""
    per_node = _get(item, "memory_per_node", int, where, None)
    if per_node and per_node > 0:
        return per_node
    per_cpu = _get(item, "memory_per_cpu", int, where, None)
    if per_cpu and per_cpu > 0:
        return per_cpu * cores
    for key in ("tres_alloc_str", "tres_req_str"):
        found = tres_memory_mb(_get(item, key, str, where, ""), where=f"{where}.{key}")
        if found:
            return -(-found // node_count)
    return 0


def _features(item: Mapping[str, Any], where: str) -> tuple[str, ...]:
    for key in ("active_features", "features"):
        value = item.get(key)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            if value:
                return tuple(v for v in value if v)
        elif isinstance(value, str):
            if value:
                return tuple(f for f in value.split(",") if f)
        elif value is not None:
            raise InputError(f"{where}.{key} = {str(value)[:60]!r}: expected a list of features")
    return ()


def _node(item: Any, where: str) -> Node:
    if not isinstance(item, Mapping):
        raise InputError(f"{where}: expected an object")
    name = _get(item, "name", str, where, "")
    if not hostlist.NODE_NAME.fullmatch(name):
        raise InputError(f"{where}.name = {name[:64]!r}: not a node name")
    where = f"{where} (node {name})"
    words = _words(item, "state", where)
    flags = tuple(str(f) for f in _get(item, "state_flags", list, where, []))
    return Node(
        name=name,
        cpus=max(1, _get(item, "cpus", int, where, 1) or 1),
        memory_mb=max(1, _get(item, "real_memory", int, where, 1) or 1),
        state=node_state(words[0] if words else "", tuple(words[1:]) + flags, where=where),
        features=_features(item, where),
        weight=_get(item, "weight", int, where, 1),
    )


def _sinfo_group(group: Any, where: str) -> list[Node]:
    """The nodes of one data_parser `sinfo --json` group (all share its state and, with -N, are one
    node). CPUs and memory are the group's minimum per node: never more than a node has."""
    if not isinstance(group, Mapping):
        raise InputError(f"{where}: expected an object")
    parts = {k: group.get(k) for k in ("node", "nodes", "cpus", "memory", "features")}
    for key in ("node", "nodes", "cpus", "memory"):
        if not isinstance(parts[key], Mapping):
            raise InputError(f"{where}.{key}: expected an object")
    names = parts["nodes"].get("nodes")  # type: ignore[union-attr]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InputError(f"{where}.nodes.nodes: expected a list of node names")
    words = _words(parts["node"], "state", f"{where}.node")  # type: ignore[arg-type]
    cpus = _get(parts["cpus"], "minimum", int, f"{where}.cpus", 1)  # type: ignore[arg-type]
    memory = _get(parts["memory"], "minimum", int, f"{where}.memory", 1)  # type: ignore[arg-type]
    features = parts["features"]
    active = ""
    if isinstance(features, Mapping):
        active = _get(features, "active", str, f"{where}.features", "") or _get(
            features, "total", str, f"{where}.features", ""
        )
    out = []
    for name in names:
        if not hostlist.NODE_NAME.fullmatch(name):
            raise InputError(f"{where}.nodes.nodes: {name[:64]!r} is not a node name")
        out.append(
            Node(
                name=name,
                cpus=max(1, cpus or 1),
                memory_mb=max(1, memory or 1),
                state=node_state(words[0] if words else "", tuple(words[1:]), where=f"{where} (node {name})"),
                features=tuple(f for f in active.split(",") if f),
            )
        )
    return out
