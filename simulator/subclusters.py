"""`--subclusters FILE`: a heterogeneous farm of homogeneous sub-clusters and the job kinds run on it.

Why a TOML file of its own (not the vjob configuration): a farm is an experiment's input, like
a trace, and the paper's farm (docs/remap/arrive-f.toml) is one such file. Each job kind gives
its run time on every sub-cluster relative to a reference (the paper's measured tables), its
memory per core (a kind whose memory exceeds a sub-cluster's memory per core thrashes there,
`thrash_factor` times slower) and the accuracy of ARRIVE-F's prediction for it (the paper's
"% Acc Prof"; the simulator perturbs the predicted gains by that much).

    thrash_factor = 2.8
    [[subcluster]]
    name = "A"                 # then nodes, cores_per_node, memory_mb_per_node, freq_ghz,
    nodes = 2                  # optional latency_us, bandwidth_mb_s, rank, [subcluster.cycles]
    ...
    [[kind]]
    name = "CG"
    memory_mb_per_core = 300
    accuracy = 0.81
    time = { A = 1.80, B = 1.0, C = 2.44, D = 1.98 }

Errors name the file, the entry and the field: `farm.toml: kind[2].time: no entry for
sub-cluster 'D'`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Annotated

from pydantic import Field

from preemption.remap.farm import Positive, SubClusterEntry, read_farm_toml, subclusters_from
from preemption.remap.models import SubCluster
from vjob.errors import InputError
from vjob.json_input import InputModel, Name, validate


class KindEntry(InputModel):
    name: Name
    memory_mb_per_core: Annotated[int, Field(ge=0)] = 0
    accuracy: Annotated[float, Field(gt=0, le=1)] = 1.0
    time: dict[Name, Positive]
    """Run time on each sub-cluster relative to the trace's run time (which is on factor 1)."""
    weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    """Share of the jobs drawn of this kind (relative to the other kinds)."""


class FarmFile(InputModel):
    thrash_factor: Annotated[float, Field(ge=1, allow_inf_nan=False)] = 2.8
    subcluster: Annotated[list[SubClusterEntry], Field(min_length=1, max_length=1000)]
    kind: Annotated[list[KindEntry], Field(min_length=1, max_length=1000)]


@dataclass(frozen=True)
class JobKind:
    name: str
    memory_mb_per_core: int
    accuracy: float
    time: MappingProxyType[str, float]
    weight: float


@dataclass(frozen=True)
class Farm:
    """The sub-clusters (in rank order, fastest first) and the job kinds."""

    subclusters: tuple[SubCluster, ...]
    kinds: tuple[JobKind, ...]
    thrash_factor: float

    @property
    def by_name(self) -> dict[str, SubCluster]:
        return {s.name: s for s in self.subclusters}

    def runtime_factor(self, kind: JobKind, cluster: SubCluster) -> float:
        """How much slower than the reference `kind` runs on `cluster`, thrashing included."""
        thrash = self.thrash_factor if kind.memory_mb_per_core > cluster.memory_mb_per_slot else 1.0
        return kind.time[cluster.name] * thrash

    def scaled(self, factor: int) -> Farm:
        """The same farm with `factor` times the nodes in every sub-cluster."""
        subs = tuple(replace(s, nodes=s.nodes * factor) for s in self.subclusters)
        return Farm(subs, self.kinds, self.thrash_factor)


def load_farm(path: str | Path) -> Farm:
    """Read and check a sub-cluster file; any problem is an InputError naming entry and field."""
    p = Path(path)
    data = read_farm_toml(p, f"--subclusters {p}")
    return parse_farm(data, str(p))


def parse_farm(data: object, source: str) -> Farm:
    doc = validate(FarmFile, data, source)
    subs = subclusters_from(doc.subcluster, source)
    names = [s.name for s in doc.subcluster]
    kinds = [k.name for k in doc.kind]
    for i, k in enumerate(doc.kind):
        if k.name in kinds[:i]:
            raise InputError(f"{source}: kind[{i}].name = {k.name!r}: duplicate kind name")
        for name in names:
            if name not in k.time:
                raise InputError(f"{source}: kind[{i}].time: no entry for sub-cluster {name!r}")
        for name in k.time:
            if name not in names:
                raise InputError(f"{source}: kind[{i}].time.{name}: no such sub-cluster (have {', '.join(names)})")
    if sum(k.weight for k in doc.kind) <= 0:
        raise InputError(f"{source}: kind[*].weight: at least one weight must be > 0")
    kinds_out = tuple(
        JobKind(k.name, k.memory_mb_per_core, k.accuracy, MappingProxyType(dict(k.time)), k.weight) for k in doc.kind
    )
    return Farm(subs, kinds_out, doc.thrash_factor)
