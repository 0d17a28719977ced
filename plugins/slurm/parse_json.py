"""squeue --json / sinfo --json (openapi v0.0.37 = Slurm 21.08, v0.0.38 = 22.05) to model objects.

Why dispatch on the declared layout: Slurm changes its JSON between releases (v0.0.37 keys
allocated_nodes by index, v0.0.38 lists them with a nodename; from 23.02 the data_parser
layouts wrap numbers in {set, infinite, number} and make job_state a list). Reading a layout
we have not checked against real output would guess; it is refused with a clear message
instead, and the adapter falls back to `scontrol show` text for such versions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugins.slurm import hostlist
from plugins.slurm.images import parse_tag, requested_image
from plugins.slurm.states import job_state, node_state, tres_memory_mb
from vjob.errors import InputError
from vjob.model import Job, JobClass, JobState, Node

SUPPORTED = ("openapi/v0.0.37", "openapi/v0.0.38")


def layout(doc: Mapping[str, Any], *, source: str) -> str:
    """The layout a Slurm JSON document declares (e.g. 'openapi/v0.0.38')."""
    meta = doc.get("meta")
    if not isinstance(meta, Mapping):
        raise InputError(f"{source}: JSON without a 'meta' object: not squeue/sinfo --json output")
    plugin = meta.get("plugin")
    if isinstance(plugin, Mapping) and isinstance(plugin.get("type"), str):
        return str(plugin["type"])
    plugins = meta.get("plugins")
    if isinstance(plugins, Mapping) and plugins.get("data_parser"):
        return str(plugins["data_parser"])
    raise InputError(f"{source}: meta declares no plugin type or data_parser version")


def check_layout(doc: Mapping[str, Any], *, source: str) -> str:
    found = layout(doc, source=source)
    if found not in SUPPORTED:
        raise InputError(
            f"{source}: JSON layout {found!r} is not supported (supported: {', '.join(SUPPORTED)}); "
            "use `scontrol show job -o` / `scontrol show node -o` output for this Slurm version"
        )
    return found


def jobs(doc: Mapping[str, Any], *, source: str) -> list[Job]:
    check_layout(doc, source=source)
    items = doc.get("jobs")
    if not isinstance(items, list):
        raise InputError(f"{source}: no 'jobs' list: this is not squeue --json output")
    return [_job(item, f"{source}: jobs[{i}]") for i, item in enumerate(items)]


def nodes(doc: Mapping[str, Any], *, source: str) -> list[Node]:
    check_layout(doc, source=source)
    items = doc.get("nodes")
    if not isinstance(items, list):
        raise InputError(f"{source}: no 'nodes' list: this is not sinfo --json output")
    seen: dict[str, Node] = {}
    for i, item in enumerate(items):
        node = _node(item, f"{source}: nodes[{i}]")
        seen.setdefault(node.name, node)
    return list(seen.values())


def _get(item: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    value = item.get(key, default)
    if isinstance(value, Mapping) and "number" in value and kind is not Mapping:
        # {"set": bool, "infinite": bool, "number": N}: Slurm's newer way of saying "maybe a number"
        value = value["number"] if value.get("set", True) and not value.get("infinite", False) else None
    if value is None:
        return default
    if isinstance(value, bool) and kind is not bool:
        raise InputError(f"{where}.{key} = {value!r}: expected {getattr(kind, '__name__', kind)}")
    if not isinstance(value, kind):
        raise InputError(f"{where}.{key} = {value!r}: expected {getattr(kind, '__name__', kind)}")
    return value


def _time(item: Mapping[str, Any], key: str, where: str) -> float | None:
    value = _get(item, key, int, where, 0)
    return float(value) if value > 0 else None


def _job(item: Any, where: str) -> Job:
    if not isinstance(item, Mapping):
        raise InputError(f"{where}: expected an object")
    job_id = _get(item, "job_id", int, where)
    if job_id is None:
        raise InputError(f"{where}: missing job_id")
    where = f"{where} (job {job_id})"
    state = job_state(_get(item, "job_state", str, where, ""), _get(item, "state_reason", str, where, ""), where=where)
    if state is JobState.PENDING and _get(item, "priority", int, where, 1) == 0:
        state = JobState.HELD  # held jobs have priority 0 whatever the reason says
    batch = _get(item, "batch_flag", bool, where, True)
    tag = parse_tag(_get(item, "admin_comment", str, where, ""))
    try:
        os_image = tag[1] if tag else requested_image(_get(item, "comment", str, where, ""))
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    cpus = _get(item, "cpus", int, where, 1) or 1
    node_count = _get(item, "node_count", int, where, 1) or 1
    cores = -(-cpus // node_count)
    memory = _memory_mb(item, cores, node_count, where)
    limit = _get(item, "time_limit", int, where, None)
    running = state in (JobState.RUNNING, JobState.SUSPENDED)
    finished = state.finished
    return Job(
        id=str(job_id),
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
        walltime=float(limit) * 60 if limit else None,
        state=state,
        allocated_nodes=hostlist.expand(_get(item, "nodes", str, where, "")) if running else (),
    )


def _memory_mb(item: Mapping[str, Any], cores: int, node_count: int, where: str) -> int:
    """Memory per node: asked per node, per CPU, or the job's TRES total shared by its nodes."""
    per_node = _get(item, "memory_per_node", int, where, None)
    if per_node:
        return per_node
    per_cpu = _get(item, "memory_per_cpu", int, where, None)
    if per_cpu:
        return per_cpu * cores
    for key in ("tres_alloc_str", "tres_req_str"):
        found = tres_memory_mb(_get(item, key, str, where, ""), where=f"{where}.{key}")
        if found:
            return -(-found // node_count)
    return 0


def _node(item: Any, where: str) -> Node:
    if not isinstance(item, Mapping):
        raise InputError(f"{where}: expected an object")
    name = _get(item, "name", str, where, "")
    if not name:
        raise InputError(f"{where}: missing name")
    where = f"{where} (node {name})"
    flags = tuple(str(f) for f in _get(item, "state_flags", list, where, []))
    features = _get(item, "active_features", str, where, "") or _get(item, "features", str, where, "")
    return Node(
        name=name,
        cpus=_get(item, "cpus", int, where, 1) or 1,
        memory_mb=_get(item, "real_memory", int, where, 1) or 1,
        state=node_state(_get(item, "state", str, where, ""), flags, where=where),
        features=tuple(f for f in features.split(",") if f),
    )
