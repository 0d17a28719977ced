"""The virtualisation-overhead (VO) model: how much slower a job runs in a vjob VM, by job kind
and by what else runs on the node.

    slowdown(kind, neighbours) = 1 + base[kind] + Σ_{n in neighbours} pair[kind][n]

Why this shape: the measurements (bench/vo_overhead.py, docs/deadline.md) are a VM alone and
with 1–3 co-located VMs; the overhead grows about linearly with co-location, and how much a
neighbour hurts depends on what both stress (two memory-bound guests share the memory bus, a
CPU-bound and an I/O-bound one barely meet). The measurement co-locates a kind with itself, so
the fit gives the diagonal; a pair of different kinds is taken as the geometric mean of the two
diagonals times `cross` (≤ 1: different kinds contend less) — an assumption the docs state.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vjob.errors import InputError

KINDS = ("cpu", "mem", "io")
_KIND_TAG = re.compile(r"(?:^|[\s,;])vjob:kind=([^\s,;]{0,64})")
_KIND_NAME = re.compile("|".join(KINDS))


def job_kind(attribute: str) -> str | None:
    """The kind a job declares in its free-text attribute (Slurm's `--comment=vjob:kind=cpu`),
    None when it declares none; one that is not a known kind is refused naming it (job
    data is hostile: checked with fullmatch, never trusted as a key)."""
    found = _KIND_TAG.search(attribute[:4096])
    if found is None:
        return None
    kind = found.group(1)
    if not _KIND_NAME.fullmatch(kind):
        raise InputError(f"job kind = {kind[:64]!r}: must be one of {', '.join(KINDS)}")
    return kind


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise InputError(f"VO model: kind = {kind!r}: must be one of {', '.join(KINDS)}")
    return kind


@dataclass(frozen=True, slots=True)
class VOModel:
    base: Mapping[str, float]
    """Overhead of a VM alone on its node, per kind (0.1 = 10 % slower than bare)."""
    pair: Mapping[str, Mapping[str, float]]
    """Extra overhead a job of kind k suffers per co-located VM of kind n: pair[k][n]."""
    source: str = "default"
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for k in KINDS:
            if k not in self.base or k not in self.pair:
                raise InputError(f"VO model ({self.source}): kind {k!r} missing from base or pair")
            for n in KINDS:
                v = self.pair[k].get(n)
                if v is None or not math.isfinite(v) or v < 0:
                    raise InputError(f"VO model ({self.source}): pair[{k}][{n}] = {v!r}: must be a number >= 0")
            if not math.isfinite(self.base[k]) or self.base[k] < 0:
                raise InputError(f"VO model ({self.source}): base[{k}] = {self.base[k]!r}: must be a number >= 0")

    def slowdown(self, kind: str, neighbours: Iterable[str] = ()) -> float:
        """Wall time in the VM over bare wall time for a job of `kind` beside `neighbours`."""
        row = self.pair[_check_kind(kind)]
        return 1.0 + self.base[kind] + sum(row[_check_kind(n)] for n in neighbours)

    def worst(self, neighbours: int = 0, kind: str | None = None) -> float:
        """The slowdown of a job beside `neighbours` VMs of unknown kinds, each the kind that
        hurts it most; of unknown `kind` (None), the worst kind. What the live agent uses: it
        does not know its neighbours' kinds, and over-predicting refuses a job where
        under-predicting lets it run to its deadline for nothing."""
        if neighbours < 0:
            raise InputError(f"VO model: neighbours = {neighbours!r}: must be >= 0")
        kinds = KINDS if kind is None else (_check_kind(kind),)
        return max(1.0 + self.base[k] + neighbours * max(self.pair[k].values()) for k in kinds)

    @classmethod
    def default(cls) -> VOModel:
        """Paravirtualisation-era figures of the paper's Xen set-up (used until a measured model is given): CPU work
        barely notices the VM; memory- and I/O-bound work pays for nested paging and emulated
        devices, more so beside its own kind."""
        return cls(
            base={"cpu": 0.02, "mem": 0.05, "io": 0.10},
            pair={
                "cpu": {"cpu": 0.02, "mem": 0.02, "io": 0.01},
                "mem": {"cpu": 0.02, "mem": 0.07, "io": 0.03},
                "io": {"cpu": 0.01, "mem": 0.03, "io": 0.08},
            },
            source="default",
        )

    @classmethod
    def physical(cls) -> VOModel:
        """No virtualisation: every slowdown is 1 (the paper's alg_1)."""
        zero = {k: 0.0 for k in KINDS}
        return cls(base=dict(zero), pair={k: dict(zero) for k in KINDS}, source="physical")

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": dict(self.base),
            "pair": {k: dict(v) for k, v in self.pair.items()},
            "source": self.source,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "<vo model>") -> VOModel:
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("base"), dict)
            or not isinstance(data.get("pair"), dict)
        ):
            raise InputError(f"{source}: a VO model is an object with 'base' and 'pair' objects")
        try:
            base = {k: float(data["base"][k]) for k in KINDS}
            pair = {k: {n: float(data["pair"][k][n]) for n in KINDS} for k in KINDS}
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{source}: VO model entry missing or not a number: {exc}") from None
        return cls(base=base, pair=pair, source=str(data.get("source", source)), meta=dict(data.get("meta") or {}))

    @classmethod
    def load(cls, path: str | Path) -> VOModel:
        """A model from JSON: either a model itself or bench/vo_overhead.py's output (fitted)."""
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except OSError as exc:
            raise InputError(f"--vo-model {p}: cannot read: {exc.strerror}") from None
        except ValueError as exc:
            raise InputError(f"--vo-model {p}: not JSON: {exc}") from None
        if isinstance(data, dict) and "measurements" in data and "base" not in data:
            return fit_vo_model(data["measurements"], source=str(p))
        return cls.from_dict(data, source=str(p))


def fit_vo_model(rows: Sequence[Mapping[str, Any]], *, cross: float = 0.5, source: str = "measured") -> VOModel:
    """Fit base and the diagonal of pair from measurement rows.

    Each row: {"kind", "colocated" (other VMs on the node, 0..), "bare_s", "vm_s"}. base[k] is
    the mean of vm/bare − 1 alone; pair[k][k] the least-squares slope through the origin of the
    extra overhead against the number of co-located VMs (negative slopes, i.e. noise, give 0).
    A kind without rows keeps the default model's figures, named in `meta["defaulted"]`."""
    if not 0 <= cross <= 1:
        raise InputError(f"fit_vo_model: cross = {cross!r}: must be in 0..1")
    ratios: dict[str, dict[int, list[float]]] = {k: {} for k in KINDS}
    for i, row in enumerate(rows):
        try:
            kind = _check_kind(str(row["kind"]))
            n = int(row["colocated"])
            bare, vm = float(row["bare_s"]), float(row["vm_s"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"VO measurement row {i}: {exc!r}: needs kind, colocated, bare_s, vm_s") from None
        if n < 0 or not (bare > 0 and vm > 0):
            raise InputError(f"VO measurement row {i}: colocated = {n}, bare_s = {bare}, vm_s = {vm}: need >= 0, > 0")
        ratios[kind].setdefault(n, []).append(vm / bare)
    default = VOModel.default()
    base: dict[str, float] = {}
    diag: dict[str, float] = {}
    defaulted = []
    for k in KINDS:
        alone = ratios[k].get(0)
        if not alone:
            base[k], diag[k] = default.base[k], default.pair[k][k]
            defaulted.append(k)
            continue
        base[k] = max(0.0, sum(alone) / len(alone) - 1.0)
        num = den = 0.0
        for n, values in ratios[k].items():
            for r in values:
                num += n * (r - 1.0 - base[k])
                den += n * n
        diag[k] = max(0.0, num / den) if den else default.pair[k][k]
    pair = {k: {n: diag[k] if k == n else cross * math.sqrt(diag[k] * diag[n]) for n in KINDS} for k in KINDS}
    return VOModel(base=base, pair=pair, source=source, meta={"cross": cross, "defaulted": defaulted})
