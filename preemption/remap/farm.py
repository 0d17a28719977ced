"""The sub-clusters of a farm file (`[[subcluster]]` entries), for the simulator and the agent.

Why here and not in the simulator: the live agent reads the same file as `vjob simulate
--subclusters` (`[remap] farm_file`) to know each sub-cluster's clock, cycles, network and
memory; only the `[[kind]]` entries (run times of job kinds) are the simulator's. One reader,
one set of error messages naming the file, the entry and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from preemption.remap.models import SubCluster
from vjob.config import parse_toml
from vjob.errors import ConfigError, InputError
from vjob.json_input import InputModel, Name, validate

MAX_FILE_BYTES = 1 << 20
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class SubClusterEntry(InputModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    """Sub-cluster name: letters, digits, _ . - (it becomes a node feature)."""
    nodes: Annotated[int, Field(ge=1, le=1_000_000)]
    cores_per_node: Annotated[int, Field(ge=1, le=4096)]
    memory_mb_per_node: Annotated[int, Field(ge=1)]
    freq_ghz: Positive
    latency_us: Positive = 50.0
    bandwidth_mb_s: Positive = 110.0
    rank: Annotated[int, Field(ge=0)] | None = None
    """Nominal speed order for "fastest free first" (0 = fastest); default: by freq_ghz."""
    cycles: dict[Name, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = Field(default_factory=dict)


class _SubClustersOnly(InputModel):
    subcluster: Annotated[list[SubClusterEntry], Field(min_length=1, max_length=1000)]


def read_farm_toml(path: str | Path, source: str) -> Any:
    """The parsed TOML of a farm file, bounded in size; errors are InputErrors naming `source`."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{source}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise InputError(f"{source}: larger than {MAX_FILE_BYTES} bytes")
    try:
        return parse_toml(raw, str(p))
    except ConfigError as exc:  # the same message, as the error class of an input file
        raise InputError(str(exc)) from None


def subclusters_from(entries: Sequence[SubClusterEntry], source: str) -> tuple[SubCluster, ...]:
    """Checked sub-clusters in rank order (fastest first): names unique, every sub-cluster with
    cycles for every event any of them counts."""
    names = [s.name for s in entries]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InputError(f"{source}: subcluster[{i}].name = {name!r}: duplicate sub-cluster name")
    events = {e for s in entries for e in s.cycles}
    for i, s in enumerate(entries):
        missing = sorted(events - set(s.cycles))
        if missing:
            raise InputError(f"{source}: subcluster[{i}].cycles: no entry for event {missing[0]!r}")
    order = sorted(range(len(names)), key=lambda i: -entries[i].freq_ghz)
    auto_rank = {i: r for r, i in enumerate(order)}
    subs = [
        SubCluster(
            name=s.name,
            nodes=s.nodes,
            cores_per_node=s.cores_per_node,
            memory_mb_per_node=s.memory_mb_per_node,
            freq_ghz=s.freq_ghz,
            latency_us=s.latency_us,
            bandwidth_mb_s=s.bandwidth_mb_s,
            cycles=s.cycles,
            rank=s.rank if s.rank is not None else auto_rank[i],
        )
        for i, s in enumerate(entries)
    ]
    subs.sort(key=lambda s: (s.rank, s.name))
    return tuple(subs)


def load_subclusters(path: str | Path) -> dict[str, SubCluster]:
    """The sub-clusters of a farm file by name (its `[[kind]]` entries, if any, are ignored)."""
    source = f"[remap] farm_file {path}"
    data = read_farm_toml(path, source)
    if isinstance(data, dict):
        data = {"subcluster": data.get("subcluster")} if "subcluster" in data else {}
    doc = validate(_SubClustersOnly, data, source)
    return {s.name: s for s in subclusters_from(doc.subcluster, source)}


__all__ = ["SubClusterEntry", "load_subclusters", "read_farm_toml", "subclusters_from"]
